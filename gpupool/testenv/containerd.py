"""containerd 2 (with runc and CNI) as a test node's real container runtime, in a private namespace.

The programs are the ones :mod:`gpupool.testenv.runtime_tools` builds from their Go modules.
Started like the fake runtime (:mod:`gpupool.testenv.mountns`): ``unshare --mount`` with private
directories over ``/var/lib/kubelet``, ``/var/log/pods``, ``/var/log/containers`` (containerd must
see the paths kubelet sees), ``/run/containerd`` (the shims' sockets, whose directory containerd
hard-codes, 2.x as 1.x) and ``/var/lib/cni`` (CNI's result cache); its own files, runc's state, the
pod network namespaces and the CDI specs live under the node's directory. containerd runs with the
built programs' directories first on ``$PATH``: it finds ``containerd-shim-runc-v2`` there, and
the shim is told runc's path in the configuration. Pods get a bridge (``gpc<hash>``) on a private
/24 of :data:`SUBNET_POOL`.

Optional stand-in device nodes (:class:`DeviceNode`, e.g. ``/dev/nvidiactl``) exist in the
namespace's ``/dev`` only: an overlay over ``/dev`` there takes them, so a device plugin can hand
out paths that a real node has and this machine lacks, and the host's ``/dev`` stays untouched.

Stopping (:func:`stop_containerd`) kills every container of this containerd through ``ctr``,
stops containerd, kills any shim left behind (found by this containerd's socket on its command
line), and deletes the bridge. The namespace, and with it the pods' network namespaces and
mounts, ends with the last of those processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from gpupool.testenv.containerd_config import (
    K8S_NAMESPACE,
    ContainerdLayout,
    render_cni_conflist,
    render_containerd_config,
)
from gpupool.testenv.errors import StartupError
from gpupool.testenv.images import Image
from gpupool.testenv.mountns import namespace_argv
from gpupool.testenv.paths import cache_dir
from gpupool.testenv.procs import ManagedProcess, spawn, wait_until
from gpupool.testenv.runtime_tools import RuntimeTools

#: Host paths containerd (or runc, CNI, the shims) writes besides kubelet's, made private.
RUNTIME_STATE_PATHS = (Path("/run/containerd"), Path("/var/lib/cni"))

#: Pod subnets come from here, one free /24 per node.
SUBNET_POOL = ipaddress.ip_network("10.214.0.0/16")

#: How long ``ctr`` may take for one call before we give up on it.
CTR_TIMEOUT = 30.0


@dataclass(frozen=True)
class DeviceNode:
    """A character device node created in the node's ``/dev`` (its namespace only)."""

    path: str
    major: int
    minor: int
    mode: int = 0o666

    def __post_init__(self) -> None:
        parts = PurePosixPath(self.path).parts
        if parts[:2] != ("/", "dev") or len(parts) < 3 or ".." in parts:
            raise ValueError(f"a stand-in device node must be under /dev: {self.path!r}")


@dataclass
class Containerd:
    """A running containerd of one test node."""

    layout: ContainerdLayout
    process: ManagedProcess
    tools: RuntimeTools
    bridge: str
    subnet: str

    def ctr(self, *args: str, check: bool = True) -> str:
        """Run ``ctr`` against this containerd in the ``k8s.io`` namespace; return its stdout."""
        return _ctr(self.tools, self.layout.socket, args, check=check)

    def import_image(self, image: Image) -> None:
        """``ctr images import`` of a docker archive, so pods can name ``image.ref``."""
        self.ctr("images", "import", str(image.archive))

    def to_record(self) -> dict[str, Any]:
        """What ``gpupool testenv down`` needs to stop it from another process."""
        return {"directory": str(self.layout.directory), "bridge": self.bridge, "ctr": str(self.tools.ctr),
                "process": self.process.to_record()}


def start_containerd(directory: Path, *, tools: RuntimeTools, binds: Mapping[Path, Path], cwd: Path,
                     pause: Image, device_nodes: Sequence[DeviceNode] = (), timeout: float = 30.0) -> Containerd:
    """Start containerd in a new mount namespace with ``binds`` (host source → target) and wait
    until its CRI socket answers; ``pause`` is the sandbox image (imported before the first pod)."""
    layout = ContainerdLayout(directory)
    for sub in (*layout.directories(), directory / "run-containerd", directory / "var-lib-cni"):
        sub.mkdir(parents=True, exist_ok=True)
    bridge = bridge_name(directory)
    subnet = _claim_subnet(bridge)
    try:
        layout.config.write_text(render_containerd_config(layout, sandbox_image=pause.ref,
                                                           cni_bin_dir=tools.cni_bin_dir, runc=tools.runc))
        (layout.cni_conf_dir / "10-gpupool.conflist").write_text(render_cni_conflist(
            name=f"gpupool-{bridge}", bridge=bridge, subnet=subnet, data_dir=layout.cni_data_dir))
        all_binds = {**binds, directory / "run-containerd": RUNTIME_STATE_PATHS[0],
                     directory / "var-lib-cni": RUNTIME_STATE_PATHS[1]}
        argv = namespace_argv(all_binds, cwd, [str(tools.containerd), "--config", str(layout.config)],
                              prelude=device_prelude(directory / "dev-overlay", device_nodes))
        process = spawn("containerd", argv, directory / "containerd.log", executable=tools.containerd, cwd=cwd,
                        env={**os.environ, "PATH": tools.path})
    except BaseException:
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
        raise
    runtime = Containerd(layout=layout, process=process, tools=tools, bridge=bridge, subnet=subnet)
    try:
        wait_until(lambda: layout.socket.is_socket() and _answers(runtime), what="the containerd socket",
                   timeout=timeout, watch=[process])
        runtime.import_image(pause)
    except BaseException:
        stop_containerd(runtime.to_record())
        raise
    return runtime


def device_prelude(overlay_dir: Path, nodes: Sequence[DeviceNode]) -> list[str]:
    """Shell lines that put an overlay over ``/dev`` (keeping ``/dev/pts`` and ``/dev/shm``) and
    create ``nodes`` in it; nothing when there are no nodes."""
    if not nodes:
        return []
    q = {name: shlex.quote(str(overlay_dir / name)) for name in ("upper", "work", "old")}
    lines = [f"mkdir -p {q['upper']} {q['work']} {q['old']}", f"mount --rbind /dev {q['old']}",
             f"mount -t overlay overlay -o lowerdir=/dev,upperdir={q['upper']},workdir={q['work']} /dev"]
    for sub in ("pts", "shm", "mqueue"):
        lines.append(f"if mountpoint -q {q['old']}/{sub}; then mount --rbind {q['old']}/{sub} /dev/{sub}; fi")
    lines.append(f"umount -l {q['old']}")
    for node in nodes:
        path = shlex.quote(node.path)
        lines += [f"mkdir -p $(dirname {path})", f"rm -f {path}",
                  f"mknod -m {node.mode:o} {path} c {node.major} {node.minor}"]
    return lines


def bridge_name(directory: Path) -> str:
    """A bridge name unique to the node's directory, within Linux's 15 characters."""
    return "gpc" + hashlib.sha256(str(directory).encode()).hexdigest()[:10]


def free_subnet(used: Sequence[ipaddress.IPv4Network]) -> str:
    """The first /24 of :data:`SUBNET_POOL` that overlaps no network in ``used``."""
    for candidate in SUBNET_POOL.subnets(new_prefix=24):
        if not any(candidate.overlaps(net) for net in used):
            return str(candidate)
    raise StartupError(f"no free /24 left in {SUBNET_POOL} for a pod network")


def stop_containerd(record: Mapping[str, Any]) -> None:
    """Stop a containerd described by :meth:`Containerd.to_record` and everything it started."""
    directory = Path(record["directory"])
    socket = ContainerdLayout(directory).socket
    process = ManagedProcess.from_record(record["process"])
    ctr = Path(record["ctr"])
    if process.alive() and socket.is_socket():
        _kill_tasks(ctr, socket)
    process.stop()
    _kill_shims(socket)
    subprocess.run(["ip", "link", "del", str(record["bridge"])], capture_output=True, check=False)


def _kill_tasks(ctr: Path, socket: Path) -> None:
    """Kill and delete every task (pause and app containers) through containerd, so runc removes
    their cgroups; errors only mean the fallback in :func:`_kill_shims` has more to do."""
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        listing = subprocess.run([str(ctr), "--address", str(socket), "--namespace", K8S_NAMESPACE, "tasks", "ls",
                                  "-q"], capture_output=True, text=True, timeout=CTR_TIMEOUT, check=False).stdout
        for task in listing.split():
            subprocess.run([str(ctr), "--address", str(socket), "--namespace", K8S_NAMESPACE, "tasks", "rm",
                            "-f", task], capture_output=True, timeout=CTR_TIMEOUT, check=False)


def _kill_shims(socket: Path, grace: float = 5.0) -> None:
    """SIGKILL the containers and shims still running for this containerd (found by the
    ``-address <socket>`` on a shim's command line). A shim's children are its containers' first
    processes; each is PID 1 of its PID namespace, so killing it ends the whole container."""
    shims = [pid for pid, argv in _processes() if "-address" in argv and str(socket) in argv
             and Path(argv[0]).name.startswith("containerd-shim")]
    if not shims:
        return
    children = [pid for pid, ppid in _parents().items() if ppid in shims]
    for pid in [*children, *shims]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in shims):
        time.sleep(0.05)


def _processes() -> list[tuple[int, list[str]]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                found.append((int(entry.name), [a.decode(errors="replace") for a in argv if a]))
    return found


def _parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    return parents


def _claim_subnet(bridge: str) -> str:
    """Create ``bridge`` with the gateway address of a free /24 and return that subnet.

    Created now, not by the CNI plugin at the first pod, so that the next node started (in this
    or another process: the choice is made under a file lock) sees the subnet taken.
    """
    with _subnet_lock():
        subnet = ipaddress.ip_network(free_subnet(_used_networks()))
        gateway = f"{next(subnet.hosts())}/{subnet.prefixlen}"
        for cmd in (["link", "add", bridge, "type", "bridge"], ["addr", "add", gateway, "dev", bridge],
                    ["link", "set", bridge, "up"]):
            result = subprocess.run(["ip", *cmd], capture_output=True, text=True, check=False)
            if result.returncode != 0:
                subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
                raise StartupError(f"ip {' '.join(cmd)} failed: {result.stderr.strip()}")
    return str(subnet)


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    path = cache_dir() / ".subnet.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _used_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks of this machine's interfaces (``ip -o -4 addr``)."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False).stdout
    nets = []
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            with contextlib.suppress(ValueError, IndexError):
                nets.append(ipaddress.ip_network(fields[fields.index("inet") + 1], strict=False))
    return [n for n in nets if isinstance(n, ipaddress.IPv4Network)]


def _answers(runtime: Containerd) -> bool:
    return subprocess.run([str(runtime.tools.ctr), "--address", str(runtime.layout.socket), "version"],
                          capture_output=True, timeout=CTR_TIMEOUT, check=False).returncode == 0


def _ctr(tools: RuntimeTools, socket: Path, args: Sequence[str], *, check: bool) -> str:
    cmd = [str(tools.ctr), "--address", str(socket), "--namespace", K8S_NAMESPACE, *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=CTR_TIMEOUT, check=False)
    if check and result.returncode != 0:
        raise StartupError(f"{' '.join(cmd)} failed (exit {result.returncode}): {result.stderr.strip()}")
    return result.stdout
