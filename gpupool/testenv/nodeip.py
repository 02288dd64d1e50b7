"""A non-loopback IPv4 address of this machine for ``kubelet --node-ip``.

kubelet refuses loopback node IPs, and the apiserver reaches the kubelet (for ``kubectl logs``) at
the node's InternalIP. Any address of a local interface works, because traffic to it never leaves
the machine. When the machine has none (a bare network namespace), we create one: a ``dummy``
interface, or, where the kernel lacks the dummy module (as on some micro-VMs), a veth pair with
both ends in this namespace. The created interface is left in place (harmless, and reused by the
next run) and named ``gpupool0`` so it is easy to find and delete (``ip link del gpupool0``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from ipaddress import IPv4Address, ip_address

#: Interface created when the machine has no usable address.
DUMMY_INTERFACE = "gpupool0"
#: Address given to that interface (from a private range unlikely to clash; /32 so no route leaks).
DUMMY_ADDRESS = "10.213.213.1"


def parse_ipv4_addresses(ip_output: str) -> list[tuple[str, str]]:
    """``(interface, address)`` pairs from the output of ``ip -4 -o addr show``."""
    pairs = []
    for line in ip_output.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "inet":
            pairs.append((fields[1].rstrip(":"), fields[3].split("/")[0]))
    return pairs


def pick_node_ip(pairs: Iterable[tuple[str, str]]) -> str | None:
    """The first address that kubelet accepts: not loopback, link-local, multicast or unspecified."""
    for _, address in pairs:
        ip = ip_address(address)
        if isinstance(ip, IPv4Address) and not (
            ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified
        ):
            return address
    return None


def local_ipv4_addresses() -> list[tuple[str, str]]:
    """This machine's IPv4 addresses, per interface."""
    result = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                            check=True)
    return parse_ipv4_addresses(result.stdout)


def find_node_ip(create: bool = True) -> str:
    """A usable node IP: an existing address, else one on an interface created for the purpose."""
    found = pick_node_ip(local_ipv4_addresses())
    if found is not None:
        return found
    if not create:
        raise RuntimeError("no non-loopback IPv4 address on this machine")
    return create_node_address()


def create_node_address() -> str:
    """Give this machine :data:`DUMMY_ADDRESS` on a new interface (needs root, CAP_NET_ADMIN)."""
    attempts = [
        [["ip", "link", "add", DUMMY_INTERFACE, "type", "dummy"]],
        [["ip", "link", "add", DUMMY_INTERFACE, "type", "veth", "peer", "name", f"{DUMMY_INTERFACE}p"],
         ["ip", "link", "set", f"{DUMMY_INTERFACE}p", "up"]],
    ]
    errors = []
    for steps in attempts:
        try:
            for step in steps:
                subprocess.run(step, capture_output=True, text=True, check=True)
            subprocess.run(["ip", "addr", "add", f"{DUMMY_ADDRESS}/32", "dev", DUMMY_INTERFACE],
                           capture_output=True, text=True, check=True)
            subprocess.run(["ip", "link", "set", DUMMY_INTERFACE, "up"], capture_output=True,
                           text=True, check=True)
            return DUMMY_ADDRESS
        except subprocess.CalledProcessError as exc:
            errors.append(f"{' '.join(exc.cmd)}: {exc.stderr.strip()}")
            subprocess.run(["ip", "link", "del", DUMMY_INTERFACE], capture_output=True, check=False)
    raise RuntimeError("cannot create a node address: " + "; ".join(errors))
