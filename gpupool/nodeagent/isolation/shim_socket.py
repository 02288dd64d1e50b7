"""The registration socket: one JSON line in, one JSON line out, per connection.

Served on the agent's event loop. An accepted registration's reply carries the peer's pid as the
agent sees it (``hostPid``): inside a pid namespace a process does not know it, and NVML reports it.
Every failure of one connection (a malformed or oversized line, a client that never sends, one that
hangs up before the reply) ends that connection with a reason in the log and, where the client
still listens, in the reply; it never ends the server.

Why the deadline is short and nothing queues (issue 28): the library writes its line as soon as it
is connected and waits a fraction of a second for the reply, so a connection that has sent nothing
after :data:`READ_TIMEOUT_S` is not the library. Every connection is read at once, on its own task;
at most ``max_connections`` are open, and when that many are, a newcomer takes the place of the
oldest connection still silent (:class:`~gpupool.netguard.gate.ConnectionGate`), so idle connections
held open by anyone in any container cannot delay a real registration. Refusals and dropped
connections are logged at most once a minute each, with a count of the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from dataclasses import dataclass, replace

from gpupool.api.shim_contract import (
    MAX_LINE_BYTES,
    MAX_RENEW_S,
    RegisterReply,
    ShimProtocolError,
    decode_request,
    encode_reply,
)
from gpupool.netguard.gate import Admitted, ConnectionGate
from gpupool.netguard.summary_log import SummaryLog
from gpupool.nodeagent.isolation.shim_registry import HEARTBEAT_S, ShimRegistry

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 0.5
"""A client that has not sent its line by then is answered with a refusal and dropped."""

MAX_CONNECTIONS = 256
"""Connections open at once; past it the oldest silent one makes room (a few KB each)."""
BACKLOG = 1024
"""Connects the kernel queues: a flood's burst fits, so the library's connect is queued, not refused."""


@dataclass(frozen=True)
class RegistrationLimits:
    """The socket's line deadline and connection cap (``--registration-timeout``,
    ``--registration-max-connections``), and the libraries' renewal interval, the heartbeat
    (``--registration-heartbeat``, :class:`~gpupool.nodeagent.isolation.shim_registry.ShimRegistry`)."""

    read_timeout_s: float = READ_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    heartbeat_s: int = HEARTBEAT_S

    def __post_init__(self) -> None:
        if self.read_timeout_s <= 0 or self.max_connections < 1:
            raise ValueError("the registration timeout must be above 0 s and the cap at least 1")
        if not 1 <= self.heartbeat_s <= MAX_RENEW_S:
            raise ValueError(f"the registration heartbeat must be 1 to {MAX_RENEW_S} s")


_SOCKET_MODE = 0o666  # processes in containers run as any user
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_pid(sock: socket.socket | None) -> int | None:
    """The connecting process's pid (``SO_PEERCRED``, in this process's pid namespace)."""
    if sock is None:
        return None
    try:
        pid, _uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                           _PEERCRED.size))
    except OSError:
        return None
    return pid if pid > 0 else None


class RegistrationServer:
    """Serves :class:`ShimRegistry` on a unix socket at ``path``."""

    def __init__(self, path: str, registry: ShimRegistry, read_timeout_s: float = READ_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.path = path
        self.registry = registry
        self.read_timeout_s = read_timeout_s
        self.connection_errors = 0
        self._server: asyncio.AbstractServer | None = None
        self._refusals = SummaryLog(log, "registrations refused")
        self._dropped = SummaryLog(log, "registration connections dropped", level=logging.INFO)
        self.gate = ConnectionGate(max_connections, notify=self._note_gate)
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def start(self) -> None:
        """Replace a stale socket file, listen, make the socket connectable by any user."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._serve, path=self.path, backlog=BACKLOG,
                                                       limit=MAX_LINE_BYTES + 1)
        os.chmod(self.path, _SOCKET_MODE)
        log.info("registration socket on %s", self.path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in self._connections.values():  # their tasks end as closed connections, not cancelled
            writer.transport.abort()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=1.0)
        self._refusals.flush()
        self._dropped.flush()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _note_gate(self, kind: str) -> None:
        self._dropped.note(kind, "registration socket: a connection %s (%d open, at most %d; the oldest silent "
                                 "one makes room)", kind, self.gate.open, self.gate.max_connections)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        place = self.gate.admit(lambda: self._close_with(writer, _BUSY))
        if place is None:
            self._close_with(writer, _BUSY)
            return
        pid = peer_pid(writer.get_extra_info("socket"))
        task = asyncio.current_task()
        if task is not None:
            self._connections[task] = writer
        try:
            outcome = await self._answer(reader, pid, place)
            if outcome is not None:
                reply, kind = outcome
                if not reply.ok:
                    self._refusals.note(kind, "registration from pid %s refused: %s", pid, reply.reason)
                writer.write(encode_reply(reply))
                await writer.drain()
        except (ConnectionError, OSError) as exc:
            self.connection_errors += 1
            self._dropped.note("went away", "registration from pid %s: the client went away (%s)", pid, exc)
        finally:
            self._connections.pop(task, None)  # type: ignore[arg-type]
            self.gate.release(place)
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    @staticmethod
    def _close_with(writer: asyncio.StreamWriter, reply: RegisterReply) -> None:
        """Tell a connection why it is dropped (if it listens) and close it; never blocks."""
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            writer.write(encode_reply(reply))
        writer.close()

    async def _answer(self, reader: asyncio.StreamReader, pid: int | None,
                      place: Admitted) -> tuple[RegisterReply, str] | None:
        """The reply to send and the refusal's kind, or None when the connection was dropped to make
        room for another."""
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), self.read_timeout_s)
        except TimeoutError:
            self.gate.counts.timed_out += 1
            return self._malformed(f"no request line within {self.read_timeout_s:g} s")
        except asyncio.LimitOverrunError:
            return self._malformed(f"request line longer than {MAX_LINE_BYTES} bytes")
        except asyncio.IncompleteReadError as exc:
            if place.released:
                return None  # evicted: already answered and closed
            if not exc.partial:
                raise ConnectionResetError("closed before sending anything") from None
            return self._malformed("connection closed before the end of the request line")
        self.gate.activate(place)
        if len(line) > MAX_LINE_BYTES:
            return self._malformed(f"request line longer than {MAX_LINE_BYTES} bytes")
        try:
            request = decode_request(line)
        except ShimProtocolError as exc:
            return self._malformed(str(exc))
        before = dict(self.registry.stats.refused)  # no await from here: the kind counted is this one's
        reply = self.registry.register(request, pid)
        if not reply.ok:
            grew = [k for k, n in self.registry.stats.refused.items() if n != before.get(k, 0)]
            return reply, grew[0] if grew else "refused"
        # The library matches NVML's per-process samples by this pid (docs/isolation.md).
        return replace(reply, host_pid=pid), ""

    def _malformed(self, reason: str) -> tuple[RegisterReply, str]:
        self.registry.stats.refuse("malformed")
        return RegisterReply(False, reason), "malformed"


_BUSY = RegisterReply(False, "the registration socket is busy with silent connections; connect again", retry=True)
