"""``gpupool remote-gpu serve``: the GPU server of remote shares, kept fed with its clients.

The node agent writes the JSON clients file (:mod:`gpupool.api.remote_gpu`). This supervisor
validates it with the contract's codec and mirrors it, whenever it changes, into the one-line-per-
client file the C server reads (``token TAB pod TAB card TAB memory-MiB TAB compute-percent``), in
a private directory (mode 0700: the tokens are secrets). A file that does not follow the contract
is reported and the last good one kept, so a half-written or broken file never disconnects
everyone. The C server (``gpupool-remote-server``, :mod:`gpupool.shim.remote_build`) forks a
process per client that leaves within about 100 ms once its token is gone from the mirror.

The supervisor also reports which clients are connected now in the connections file
(:mod:`gpupool.api.remote_connections`; by default beside the clients file, where the node agent
reads it): each authenticated connection's process names its pod and
card (never the token) in a file of a second private directory, removed when it ends; the
supervisor counts those of live processes of the C server, drops the files of processes that died
without removing theirs, and rewrites ``status`` when what it reports changes (empty when it stops).
A connection's file also says when it was authenticated and the bytes its client's allocations
hold (rewritten by the C server within about 100 ms of a change); under ``--enforce-compute`` it
names the interception library's region of the client's executor, where the library's compute
controller records the client's measured SM use, which the supervisor reads from there.

With a certificate and key the server speaks TLS; without, a listen address that is not loopback is
refused unless ``allow_plain`` (docs/remote-gpu.md, "Trust"). The C server loads the certificate
and key again for new connections when they change on disk or when it gets SIGHUP, which this
supervisor passes on (the node agent sends it after a renewal); connections open then keep theirs.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from gpupool.api.remote_connections import CONNECTIONS_FILE, ClientConnections, encode_connections
from gpupool.api.remote_gpu import ClientsFileError, RemoteClient, decode_clients, parse_endpoint
from gpupool.files.replace import replace_file
from gpupool.remotegpu.cublas_lookup import find_cublas
from gpupool.shim.build import library_path
from gpupool.shim.region import MAX_DEVICES, RegionFormatError, read_region
from gpupool.shim.remote_build import server_program

log = logging.getLogger(__name__)
POLL_S = 0.1
MIRROR_NAME = "clients.tab"
CONNECTIONS_DIR = "connections"


class RemoteServeError(RuntimeError):
    """The server cannot start as asked; the message says why."""


def mirror_text(clients: Sequence[RemoteClient]) -> str:
    """The C server's clients file (the codec already refused tabs, commas and line breaks in the
    fields): a client of several cards has their UUIDs comma-separated, in its devices' order."""
    return "".join(f"{c.token}\t{c.pod}\t{','.join(c.card_uuids)}\t{c.memory_mib}\t{c.compute_percent}\n"
                   for c in clients)


@dataclass(frozen=True)
class ListenFlags:
    """How the caller spells the listen options in its messages: ``gpupool remote-gpu serve``'s own
    flags by default, the node agent's ``--remote-gpu-*`` ones when it starts the server."""

    listen: str = "--listen"
    tls_cert: str = "--tls-cert"
    tls_key: str = "--tls-key"
    allow_plain: str = "--allow-plain"


SERVE_FLAGS = ListenFlags()


def is_loopback(host: str, flags: ListenFlags = SERVE_FLAGS) -> bool:
    """Whether every address ``host`` names is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise RemoteServeError(f"{flags.listen} host {host!r}: {exc}") from None
    addresses = {ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos}
    return bool(addresses) and all(a.is_loopback or (a.version == 6 and a.ipv4_mapped is not None
                                                     and a.ipv4_mapped.is_loopback) for a in addresses)


@dataclass(frozen=True)
class TlsFiles:
    """The server's certificate chain and private key (PEM); clients check it against their CA."""

    certificate: Path
    key: Path


def check_listen(listen: str, allow_plain: bool, tls: TlsFiles | None = None,
                 flags: ListenFlags = SERVE_FLAGS) -> None:
    """Refuse a listen address the server must not use (bad syntax, or plain TCP off loopback); the
    message names the options as ``flags`` spells them."""
    try:
        host, _ = parse_endpoint(listen, any_port=True)
    except ValueError as exc:
        raise RemoteServeError(f"{flags.listen}: {exc}") from None
    if tls is None and not allow_plain and not is_loopback(host, flags):
        raise RemoteServeError(f"{flags.listen} {listen}: not a loopback address; give {flags.tls_cert} and "
                               f"{flags.tls_key}, or {flags.allow_plain} to serve plain TCP on this network "
                               "anyway (tokens in the clear)")
    for path in (tls.certificate, tls.key) if tls is not None else ():
        if not path.is_file():
            raise RemoteServeError(f"TLS file {path}: not found")


@dataclass
class ClientsMirror:
    """Keeps ``mirror`` equal to the last readable version of ``source``."""

    source: Path
    mirror: Path
    _seen: tuple[int, int, int] | None = None
    clients: int = 0

    def refresh(self) -> bool:
        """Re-read ``source`` when it changed; True when the mirror was rewritten."""
        try:
            info = self.source.stat()
            seen = (info.st_ino, info.st_mtime_ns, info.st_size)
        except FileNotFoundError:
            seen = (0, 0, 0)
        if seen == self._seen:
            return False
        self._seen = seen
        if seen == (0, 0, 0):
            log.warning("remote GPU: clients file %s is absent: serving no client", self.source)
            return self._write([])
        try:
            clients = decode_clients(self.source.read_text())
        except (ClientsFileError, OSError, UnicodeDecodeError) as exc:
            log.error("remote GPU: clients file %s not read, keeping the last one: %s", self.source, exc)
            if not self.mirror.exists():
                self._write([])
            return False
        return self._write(clients)

    def _write(self, clients: Sequence[RemoteClient]) -> bool:
        replace_file(self.mirror, mirror_text(clients))  # mode 0600: the tokens are secrets
        self.clients = len(clients)
        log.info("remote GPU: serving %d client(s)", len(clients))
        return True


def _child_of(pid: int, parent: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process whose parent is ``parent``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()  # after "pid (command)": state, parent, ...
    return len(fields) > 1 and fields[0] != "Z" and fields[1] == str(parent)


@dataclass(frozen=True)
class ConnectionLine:
    """One connection's file: its client, since when (unix seconds), the bytes its allocations hold,
    and where its SM use is measured (the card's ordinal in the library's region; -1 and no region:
    not measured). A server older than the figures writes pod and card only (None, None, -1, "")."""

    pod: str
    card: str
    since: int | None = None
    held_bytes: int | None = None
    ordinal: int = -1
    region: str = ""


def parse_connection_line(text: str) -> ConnectionLine | None:
    """The file's line (``pod TAB card [TAB since TAB held TAB ordinal TAB region]``); None when it
    names no client."""
    fields = text.rstrip("\n").split("\t")
    if len(fields) < 2 or not fields[0] or not fields[1]:
        return None
    if len(fields) < 6 or not all(f.lstrip("-").isdigit() for f in fields[2:5]):
        return ConnectionLine(fields[0], fields[1])
    return ConnectionLine(fields[0], fields[1], int(fields[2]), int(fields[3]), int(fields[4]), fields[5])


def measured_sm_percent(line: ConnectionLine) -> int | None:
    """The client's SM use as the interception library's compute controller last measured it in the
    region the line names; None where nothing measures it (no region, no compute share: the library
    runs no controller then, or a region that does not read)."""
    if not line.region or not 0 <= line.ordinal < MAX_DEVICES:
        return None
    try:
        card = read_region(Path(line.region)).devices[line.ordinal]
    except (OSError, RegionFormatError):
        return None
    return card.util_container_percent if card.compute_percent > 0 else None


SM_READ_S = 1.0
"""How often a connection's region is read again: the library measures every 50 ms, but a region is
about 40 kB and the report is read by people and scrapes, not by the limit."""


@dataclass
class SmReadings:
    """:func:`measured_sm_percent` per region, each read at most every :data:`SM_READ_S`."""

    _last: dict[tuple[str, int], tuple[float, int | None]] = field(default_factory=dict)

    def __call__(self, line: ConnectionLine) -> int | None:
        now, key = time.monotonic(), (line.region, line.ordinal)
        cached = self._last.get(key)
        if cached is None or now - cached[0] >= SM_READ_S:
            cached = self._last[key] = (now, measured_sm_percent(line))
        return cached[1]

    def keep_only(self, lines: Sequence[ConnectionLine]) -> None:
        """Forget the regions of connections that ended."""
        live = {(line.region, line.ordinal) for line in lines}
        self._last = {key: value for key, value in self._last.items() if key in live}


def connection_lines(directory: Path, server_pid: int) -> list[ConnectionLine]:
    """The connections the C server's client processes announced in ``directory``; the file of a
    process that is gone (or not the server's child: its pid reused) is removed."""
    found: list[ConnectionLine] = []
    for entry in directory.iterdir():
        if not entry.name.isdigit():
            continue  # a file being written (".<pid>")
        if not _child_of(int(entry.name), server_pid):
            entry.unlink(missing_ok=True)
            continue
        with contextlib.suppress(OSError):
            line = parse_connection_line(entry.read_text())
            if line is not None:
                found.append(line)
    return found


def live_connections(directory: Path, server_pid: int,
                     sm: Callable[[ConnectionLine], int | None] = measured_sm_percent) -> list[ClientConnections]:
    """What :func:`summed` makes of the connections announced in ``directory`` now."""
    return summed(connection_lines(directory, server_pid), sm)


def summed(lines: Sequence[ConnectionLine],
           sm: Callable[[ConnectionLine], int | None] = measured_sm_percent) -> list[ClientConnections]:
    """Per (pod, card): the live connections, the bytes their allocations hold (None when a line
    does not say), the oldest one's start and the SM use ``sm`` reads (summed over the connections
    that measure it, at most 100), sorted by pod and card."""
    grouped: defaultdict[tuple[str, str], list[ConnectionLine]] = defaultdict(list)
    for line in lines:
        grouped[(line.pod, line.card)].append(line)
    found = []
    for (pod, card), group in sorted(grouped.items()):
        held = [line.held_bytes for line in group]
        since = [line.since for line in group if line.since is not None]
        used = [m for m in map(sm, group) if m is not None]
        found.append(ClientConnections(pod, card, len(group),
                                       memory_used_bytes=None if None in held else sum(h or 0 for h in held),
                                       connected_since=min(since) if since else None,
                                       sm_percent=min(sum(used), 100) if used else None))
    return found


@dataclass
class ConnectionsReport:
    """Keeps ``status`` equal to the server's live connections (rewritten only on a change)."""

    directory: Path
    status: Path
    _last: str | None = None
    _failed: bool = False
    _sm: SmReadings = field(default_factory=SmReadings)

    def refresh(self, server_pid: int | None) -> bool:
        """Count again (``server_pid`` None: the server is gone, nothing is connected); True when
        ``status`` was rewritten. A status that cannot be written is logged once and tried again at
        the next change: reporting must never stop the server."""
        lines = connection_lines(self.directory, server_pid) if server_pid is not None else []
        self._sm.keep_only(lines)
        text = encode_connections(summed(lines, self._sm))
        if text == self._last:
            return False
        try:
            replace_file(self.status, text, mode=0o644)
        except OSError as exc:
            if not self._failed:
                log.warning("remote GPU: connections file %s not written: %s", self.status, exc)
            self._failed = True
            return False
        self._last, self._failed = text, False
        return True


def serve(listen: str, clients_file: Path, *, driver: str = "libcuda.so.1", allow_plain: bool = False,
          tls: TlsFiles | None = None, enforce_compute: bool = False, status: Path | None = None,
          cublas: str | None = None) -> int:
    """Run the GPU server until it exits or this process is told to stop; returns its exit code.

    ``enforce_compute``: each client's calls run in a process under the interception library with
    the client's memory and compute share (``compute_percent``) as its limits. ``status``: the
    connections file kept up to date (see the module docstring; None: :data:`CONNECTIONS_FILE`
    beside ``clients_file``). ``cublas``: NVIDIA's ``libcublas.so.12`` for the clients' cuBLAS
    calls; None: looked for (:func:`gpupool.remotegpu.cublas_lookup.find_cublas`), which is logged."""
    check_listen(listen, allow_plain, tls)
    program = server_program()
    blas = find_cublas(cublas)
    log.log(logging.INFO if blas.path is not None and not blas.problems() else logging.WARNING, "%s", blas.describe())
    shim = [] if not enforce_compute else ["--shim", str(library_path())]
    private = Path(tempfile.mkdtemp(prefix="gpupool-remote-gpu-"))
    stopping: list[int] = []
    reloads: list[int] = []
    report: ConnectionsReport | None = None

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    def reload(signum: int, _frame: FrameType | None) -> None:
        reloads.append(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, reload)
    try:
        mirror = ClientsMirror(clients_file, private / MIRROR_NAME)
        mirror.refresh()
        (private / CONNECTIONS_DIR).mkdir(mode=0o700)
        report = ConnectionsReport(private / CONNECTIONS_DIR, status or clients_file.with_name(CONNECTIONS_FILE))
        report.refresh(None)
        command = [str(program), "--listen", listen, "--clients", str(mirror.mirror), "--driver", driver,
                   *(["--allow-plain"] if allow_plain else []), *shim, "--status-dir", str(report.directory),
                   *(["--cublas", blas.server_argument] if blas.server_argument else []),
                   *(["--tls-cert", str(tls.certificate), "--tls-key", str(tls.key)] if tls is not None else [])]
        with subprocess.Popen(command, env=blas.server_environment(os.environ)) as server:
            while server.poll() is None and not stopping:
                if reloads:  # the C server reloads its TLS files for new connections
                    reloads.clear()
                    server.send_signal(signal.SIGHUP)
                mirror.refresh()
                report.refresh(server.pid)
                time.sleep(POLL_S)
            if server.poll() is None:
                server.terminate()
                try:
                    server.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    server.kill()
            code = server.wait()
        return 0 if stopping else code
    finally:
        if report is not None:
            report.refresh(None)
        for signum, handler in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, handler)
        shutil.rmtree(private, ignore_errors=True)
