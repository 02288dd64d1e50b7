"""The registration socket: one JSON line in, one JSON line out, per connection.

Served on the agent's event loop. An accepted registration's reply carries the peer's pid as the
agent sees it (``hostPid``): inside a pid namespace a process does not know it, and NVML reports it.
Every failure of one connection (a malformed or oversized line, a client that never sends, one that
hangs up before the reply) ends that connection with a reason in the log and, where the client
still listens, in the reply; it never ends the server. Connections beyond :data:`MAX_CONNECTIONS`
at once wait for a slot, so a flood cannot take the agent's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from dataclasses import replace

from gpupool.api.shim_contract import (
    MAX_LINE_BYTES,
    RegisterReply,
    ShimProtocolError,
    decode_request,
    encode_reply,
)
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 2.0
"""A client that has not sent its line by then is answered with a refusal and dropped."""

MAX_CONNECTIONS = 64
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

    def __init__(self, path: str, registry: ShimRegistry, read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self.path = path
        self.registry = registry
        self.read_timeout_s = read_timeout_s
        self.connection_errors = 0
        self._server: asyncio.AbstractServer | None = None
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)

    async def start(self) -> None:
        """Replace a stale socket file, listen, make the socket connectable by any user."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._serve, path=self.path,
                                                       limit=MAX_LINE_BYTES + 1)
        os.chmod(self.path, _SOCKET_MODE)
        log.info("registration socket on %s", self.path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with self._slots:
            pid = peer_pid(writer.get_extra_info("socket"))
            try:
                reply = await self._answer(reader, pid)
                if not reply.ok:
                    log.warning("registration from pid %s refused: %s", pid, reply.reason)
                writer.write(encode_reply(reply))
                await writer.drain()
            except (ConnectionError, OSError) as exc:
                self.connection_errors += 1
                log.info("registration from pid %s: the client went away (%s)", pid, exc)
            finally:
                writer.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, pid: int | None) -> RegisterReply:
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), self.read_timeout_s)
        except TimeoutError:
            return self._malformed(f"no request line within {self.read_timeout_s:g} s")
        except asyncio.LimitOverrunError:
            return self._malformed(f"request line longer than {MAX_LINE_BYTES} bytes")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise ConnectionResetError("closed before sending anything") from None
            return self._malformed("connection closed before the end of the request line")
        if len(line) > MAX_LINE_BYTES:
            return self._malformed(f"request line longer than {MAX_LINE_BYTES} bytes")
        try:
            request = decode_request(line)
        except ShimProtocolError as exc:
            return self._malformed(str(exc))
        reply = self.registry.register(request, pid)
        # The library matches NVML's per-process samples by this pid (docs/isolation.md).
        return replace(reply, host_pid=pid) if reply.ok else reply

    def _malformed(self, reason: str) -> RegisterReply:
        self.registry.stats.refuse("malformed")
        return RegisterReply(False, reason)
