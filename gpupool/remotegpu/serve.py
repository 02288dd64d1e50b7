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
without removing theirs, and rewrites ``status`` when the count changes (empty when it stops).

With a certificate and key the server speaks TLS; without, a listen address that is not loopback is
refused unless ``allow_plain`` (docs/remote-gpu.md, "Trust").
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from gpupool.api.remote_connections import CONNECTIONS_FILE, ClientConnections, encode_connections
from gpupool.api.remote_gpu import ClientsFileError, RemoteClient, decode_clients, parse_endpoint
from gpupool.files.replace import replace_file
from gpupool.shim.build import library_path
from gpupool.shim.remote_build import server_program

log = logging.getLogger(__name__)
POLL_S = 0.1
MIRROR_NAME = "clients.tab"
CONNECTIONS_DIR = "connections"


class RemoteServeError(RuntimeError):
    """The server cannot start as asked; the message says why."""


def mirror_text(clients: Sequence[RemoteClient]) -> str:
    """The C server's clients file (the codec already refused tabs and line breaks in the fields)."""
    return "".join(f"{c.token}\t{c.pod}\t{c.card_uuid}\t{c.memory_mib}\t{c.compute_percent}\n" for c in clients)


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


def live_connections(directory: Path, server_pid: int) -> Counter[tuple[str, str]]:
    """Connections per (pod, card uuid) the C server's client processes announced in ``directory``;
    the file of a process that is gone (or not the server's child: its pid reused) is removed."""
    found: Counter[tuple[str, str]] = Counter()
    for entry in directory.iterdir():
        if not entry.name.isdigit():
            continue  # a file being written (".<pid>")
        if not _child_of(int(entry.name), server_pid):
            entry.unlink(missing_ok=True)
            continue
        with contextlib.suppress(OSError):
            pod, _, card = entry.read_text().rstrip("\n").partition("\t")
            if pod and card:
                found[(pod, card)] += 1
    return found


@dataclass
class ConnectionsReport:
    """Keeps ``status`` equal to the server's live connections (rewritten only on a change)."""

    directory: Path
    status: Path
    _last: str | None = None
    _failed: bool = False

    def refresh(self, server_pid: int | None) -> bool:
        """Count again (``server_pid`` None: the server is gone, nothing is connected); True when
        ``status`` was rewritten. A status that cannot be written is logged once and tried again at
        the next change: reporting must never stop the server."""
        counts = live_connections(self.directory, server_pid) if server_pid is not None else Counter()
        text = encode_connections(ClientConnections(pod, card, n) for (pod, card), n in counts.items())
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
          tls: TlsFiles | None = None, enforce_compute: bool = False, status: Path | None = None) -> int:
    """Run the GPU server until it exits or this process is told to stop; returns its exit code.

    ``enforce_compute``: each client's calls run in a process under the interception library with
    the client's memory and compute share (``compute_percent``) as its limits. ``status``: the
    connections file kept up to date (see the module docstring; None: :data:`CONNECTIONS_FILE`
    beside ``clients_file``)."""
    check_listen(listen, allow_plain, tls)
    program = server_program()
    shim = [] if not enforce_compute else ["--shim", str(library_path())]
    private = Path(tempfile.mkdtemp(prefix="gpupool-remote-gpu-"))
    stopping: list[int] = []
    report: ConnectionsReport | None = None

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        mirror = ClientsMirror(clients_file, private / MIRROR_NAME)
        mirror.refresh()
        (private / CONNECTIONS_DIR).mkdir(mode=0o700)
        report = ConnectionsReport(private / CONNECTIONS_DIR, status or clients_file.with_name(CONNECTIONS_FILE))
        report.refresh(None)
        command = [str(program), "--listen", listen, "--clients", str(mirror.mirror), "--driver", driver,
                   *(["--allow-plain"] if allow_plain else []), *shim, "--status-dir", str(report.directory),
                   *(["--tls-cert", str(tls.certificate), "--tls-key", str(tls.key)] if tls is not None else [])]
        with subprocess.Popen(command) as server:
            while server.poll() is None and not stopping:
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
