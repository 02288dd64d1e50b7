"""The contract between the interception library inside a container and the node agent.

Two sides implement it: the C library (``gpupool/shim``) and the node agent's registration server
(:mod:`gpupool.nodeagent.isolation`). The paths below are where Allocate's mounts put things *inside*
the container; the host side of each mount is the agent's business. The registration protocol is
one JSON line each way over a unix socket: the library presents the per-container token Allocate
handed out, the agent answers whether it knows it. Tests that play the library's side use the same
codec, so a drift between the two sides fails a test instead of a registration.

Every decode error is a :class:`ShimProtocolError` whose message says what was wrong; the server
sends that message back as the refusal reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeGuard

# ----------------------------------------------------------------------- paths in the container
CONTAINER_LIBRARY_PATH = "/usr/local/gpupool/lib/libgpupool-shim.so"
"""The library, bind-mounted read-only from the host file ``gpupool shim path`` prints."""

PRELOAD_PATH = "/etc/ld.so.preload"
"""The dynamic loader's preload list, a read-only bind mount of a host file naming the library."""

PRELOAD_LINE = CONTAINER_LIBRARY_PATH + "\n"
"""The whole content of that file: one line, the library's path in the container."""

CONTAINER_SHIM_DIR = "/var/run/gpupool"
"""Where the container's accounting region is mounted (``GPUPOOL_SHIM_DIR``)."""

TOKEN_FILE = "token"
"""In the per-container directory: the container's token, one line."""

REGION_FILE = "memory.region"
"""In the per-container directory: the shared accounting region (the agent creates it, sized)."""

CONTAINER_REGION_PATH = f"{CONTAINER_SHIM_DIR}/{REGION_FILE}"
"""The region as the container sees it: a read-write bind mount of that one file, which the
container can write (its processes account there) but neither unlink nor replace (a mount point),
so deleting it cannot reset the container's account."""

CONTAINER_GRANT_DIR = "/etc/gpupool"
"""The per-container directory as mounted read-only: the grant, the token, the region (read-only)."""

GRANT_FILE = "grant"
"""In the per-container directory: what the node granted the container (:class:`NodeGrant`)."""

CONTAINER_GRANT_PATH = f"{CONTAINER_GRANT_DIR}/{GRANT_FILE}"
"""Where the library reads the grant. Compiled into the library (``SHIM_GRANT_PATH`` in
``grant.c``), never taken from the environment: a container can neither move nor hide it."""

CONTAINER_AGENT_SOCKET_DIR = "/var/run/gpupool-agent"
"""The agent's socket directory as mounted (read-only) into every container with a share."""

AGENT_SOCKET_NAME = "agent.sock"
CONTAINER_AGENT_SOCKET = f"{CONTAINER_AGENT_SOCKET_DIR}/{AGENT_SOCKET_NAME}"

# ----------------------------------------------------------------------------- registration
PROTOCOL_VERSION = 1
OP_REGISTER = "register"
MAX_LINE_BYTES = 4096
HOST_PID_KEY = "hostPid"
"""The reply's optional field: the registering process's pid in the agent's pid namespace."""
RENEW_KEY = "renewS"
"""The reply's optional field: seconds until the library sends its line again (the heartbeat)."""
MAX_RENEW_S = 3600
"""A request or reply line longer than this (newline included) is refused unread."""

TOKEN_BYTES = 32
TOKEN_HEX_CHARS = 2 * TOKEN_BYTES
_TOKEN = re.compile(rf"^[0-9a-f]{{{TOKEN_HEX_CHARS}}}$")
_MAX_NAME = 512  # namespace/name and container are DNS names; anything longer is not one


class ShimProtocolError(ValueError):
    """A line that does not follow the registration protocol; the message is the reason."""


# ----------------------------------------------------------------------------- the node's grant
GRANT_VERSION = "1"
_GRANT_KEYS = ("version", "memory_mib", "compute_percent", "compute_mode", "card_uuids", "region", "socket",
               "token", "pod", "container")
_REMOTE_KEYS = ("remote_endpoint", "remote_token")
_VIRTUAL_KEY = "virtual_devices"
MAX_GRANT_VIRTUAL_DEVICES = 16
"""Most ordinals the library presents one card as (its SHIM_MAX_DEVICES)."""
_GRANT_VALUE = re.compile(r"^[^\n\r\x00]*$")


@dataclass(frozen=True)
class NodeGrant:
    """What the node agent grants one container, as the library reads it from :data:`GRANT_FILE`.

    Per CUDA ordinal (the order of ``GPUPOOL_CARD_UUIDS``): memory in MiB and compute in percent
    (0: no compute limit). The environment can only lower these; an ordinal the grant does not
    list refuses every allocation. One ``key=value`` per line, ``#`` lines are comments, unknown
    keys are skipped (a newer agent may add keys); ``version``, ``memory_mib`` and ``region`` are
    required, and a grant the library cannot read refuses every allocation.
    """

    memory_mib: tuple[int, ...]
    compute_percent: tuple[int, ...]
    compute_mode: str
    card_uuids: tuple[str, ...]
    region: str
    socket: str
    token: str
    pod: str
    container: str
    remote_endpoint: str = ""
    """``host:port`` of the GPU server a remote share is used through (docs/remote-gpu.md); empty
    for a local share. Read by the GPU client library, which replaces libcuda.so.1 there."""
    remote_token: str = ""
    """The remote client's token, as in the GPU server's clients file (:mod:`gpupool.api.remote_gpu`)."""
    virtual_devices: int = 1
    """How many CUDA ordinals the library presents the grant's one card as (a virtual-card slice of
    assignment-v1's ``devices``; docs/virtual-cards.md): the card's memory is split evenly between
    them. Written as ``virtual_devices=n`` only above 1, so other grants' text is unchanged and an
    older library (which skips the key) presents one device with the total."""

    def __post_init__(self) -> None:
        if not 1 <= self.virtual_devices <= MAX_GRANT_VIRTUAL_DEVICES:
            raise ShimProtocolError(f"grant virtual_devices {self.virtual_devices}: "
                                    f"1 to {MAX_GRANT_VIRTUAL_DEVICES}")
        if self.virtual_devices > 1 and len(self.memory_mib) != 1:
            raise ShimProtocolError(f"grant virtual_devices {self.virtual_devices}: only one card can be presented as "
                                    f"several devices, the grant lists {len(self.memory_mib)}")


def encode_grant(grant: NodeGrant) -> str:
    """The grant file's text."""
    values = {"version": GRANT_VERSION, "memory_mib": ",".join(map(str, grant.memory_mib)),
              "compute_percent": ",".join(map(str, grant.compute_percent)), "compute_mode": grant.compute_mode,
              "card_uuids": ",".join(grant.card_uuids), "region": grant.region, "socket": grant.socket,
              "token": grant.token, "pod": grant.pod, "container": grant.container}
    for key, value in (("remote_endpoint", grant.remote_endpoint), ("remote_token", grant.remote_token)):
        if value:  # written only for a remote share, so a local grant's text is unchanged
            values[key] = value
    if grant.virtual_devices > 1:
        values[_VIRTUAL_KEY] = str(grant.virtual_devices)
    for key, value in values.items():
        if not _GRANT_VALUE.match(value):
            raise ShimProtocolError(f"grant {key}: a line break or NUL in {value!r}")
    lines = [f"{key}={values[key]}" for key in (*_GRANT_KEYS, *_REMOTE_KEYS, _VIRTUAL_KEY) if key in values]
    return "# written by the gpupool node agent; mounted read-only into the container\n" + "\n".join(lines) + "\n"


def decode_grant(text: str) -> NodeGrant:
    """Read a grant file back (tests and tools; the library has its own reader in C)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ShimProtocolError(f"grant line {line!r}: expected key=value")
        values[key] = value
    if values.get("version") != GRANT_VERSION:
        raise ShimProtocolError(f"grant version {values.get('version')!r}: this reader knows {GRANT_VERSION}")
    try:
        memory = tuple(int(v) for v in values["memory_mib"].split(","))
        compute = tuple(int(v) for v in values["compute_percent"].split(",")) if values.get("compute_percent") else ()
        virtual = int(values.get(_VIRTUAL_KEY, "1"))
    except (KeyError, ValueError) as exc:
        raise ShimProtocolError(f"grant limits: {exc}") from None
    uuids = tuple(values["card_uuids"].split(",")) if values.get("card_uuids") else ()
    return NodeGrant(memory, compute, values.get("compute_mode", "hard"), uuids, values.get("region", ""),
                     values.get("socket", ""), values.get("token", ""), values.get("pod", ""),
                     values.get("container", ""), values.get("remote_endpoint", ""), values.get("remote_token", ""),
                     virtual)


@dataclass(frozen=True)
class RegisterRequest:
    """What a process presents: its token, its pid (as it sees it) and whose share it claims."""

    token: str
    pid: int
    pod: str  # "namespace/name", as in GPUPOOL_POD
    container: str


@dataclass(frozen=True)
class RegisterReply:
    """The agent's answer; ``reason`` says why when ``ok`` is false.

    ``host_pid`` (``"hostPid"`` on the wire, optional, only with ``ok``) is the registering process's
    pid as the agent saw it through ``SO_PEERCRED``: the host's pid namespace when the agent runs in
    it. NVML reports that pid, not the one the process knows itself by inside its container, so
    the library needs it to find its own utilisation. A reply without it is still valid (an older
    agent); the library then matches by its own pid, which is right only outside a pid namespace.

    ``renew_s`` (``"renewS"``, optional, only with ``ok``): the library sends the same request again
    every that many seconds, for as long as the process lives, and the agent records each as the
    container's heartbeat (docs/isolation.md, "Heartbeat"). Without it the library registers once.

    ``retry`` (``"retry": true``, optional, only without ``ok``): the refusal is the agent's state,
    not the request's (its socket busy with silent connections), so the library asks again within
    its start-up budget; any other refusal is final (asking again changes nothing).
    """

    ok: bool
    reason: str = ""
    host_pid: int | None = None
    renew_s: int | None = None
    retry: bool = False


def is_token(text: str) -> bool:
    """Whether ``text`` has a token's form (64 lower-case hex digits)."""
    return bool(_TOKEN.match(text))


def encode_request(request: RegisterRequest) -> bytes:
    """The request line the library sends (newline-terminated)."""
    return _line({"v": PROTOCOL_VERSION, "op": OP_REGISTER, "token": request.token, "pid": request.pid,
                  "pod": request.pod, "container": request.container})


def decode_request(line: bytes) -> RegisterRequest:
    """Read one request line (with or without its newline)."""
    doc = _document(line)
    if doc.get("op") != OP_REGISTER:
        raise ShimProtocolError(f"op {doc.get('op')!r}: only {OP_REGISTER!r} is known")
    token, pid = doc.get("token"), doc.get("pid")
    if not isinstance(token, str) or not is_token(token):
        raise ShimProtocolError(f"token: expected {TOKEN_HEX_CHARS} lower-case hex digits")
    if not _positive_int(pid):
        raise ShimProtocolError(f"pid: expected a positive integer, got {pid!r}")
    pod, container = doc.get("pod", ""), doc.get("container", "")
    for key, value in (("pod", pod), ("container", container)):
        if not isinstance(value, str) or len(value) > _MAX_NAME:
            raise ShimProtocolError(f"{key}: expected a string of at most {_MAX_NAME} characters")
    return RegisterRequest(token, pid, pod, container)


def encode_reply(reply: RegisterReply) -> bytes:
    """The reply line the agent sends (newline-terminated, the reason cut to fit one line)."""
    doc: dict[str, Any] = {"v": PROTOCOL_VERSION, "ok": reply.ok}
    if not reply.ok:
        doc["reason"] = reply.reason[: MAX_LINE_BYTES // 2]
        if reply.retry:
            doc["retry"] = True
    else:
        if reply.host_pid is not None:
            doc[HOST_PID_KEY] = reply.host_pid
        if reply.renew_s is not None:
            doc[RENEW_KEY] = reply.renew_s
    return _line(doc)


def decode_reply(line: bytes) -> RegisterReply:
    """Read one reply line (the library's side; tests use it)."""
    doc = _document(line)
    ok, reason, host_pid = doc.get("ok"), doc.get("reason", ""), doc.get(HOST_PID_KEY)
    if not isinstance(ok, bool) or not isinstance(reason, str):
        raise ShimProtocolError("reply: expected a boolean ok and a string reason")
    if host_pid is not None and not _positive_int(host_pid):
        raise ShimProtocolError(f"{HOST_PID_KEY}: expected a positive integer, got {host_pid!r}")
    renew_s = doc.get(RENEW_KEY)
    if renew_s is not None and not (_positive_int(renew_s) and renew_s <= MAX_RENEW_S):
        raise ShimProtocolError(f"{RENEW_KEY}: expected an integer from 1 to {MAX_RENEW_S}, got {renew_s!r}")
    retry = doc.get("retry", False)
    if not isinstance(retry, bool):
        raise ShimProtocolError(f"retry: expected a boolean, got {retry!r}")
    return RegisterReply(ok, reason, host_pid, renew_s, retry=retry and not ok)


def _positive_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _line(doc: dict[str, Any]) -> bytes:
    data = json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"
    if len(data) > MAX_LINE_BYTES:
        raise ShimProtocolError(f"line of {len(data)} bytes exceeds {MAX_LINE_BYTES}")
    return data


def _document(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_LINE_BYTES:
        raise ShimProtocolError(f"line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    try:
        doc = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ShimProtocolError(f"not a JSON line: {exc}") from None
    if not isinstance(doc, dict):
        raise ShimProtocolError("not a JSON object")
    if doc.get("v") != PROTOCOL_VERSION:
        raise ShimProtocolError(f"v {doc.get('v')!r}: this agent speaks version {PROTOCOL_VERSION}")
    return doc
