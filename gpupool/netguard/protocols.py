"""Protocol layers that put an HTTP server's connections under a :class:`ConnectionGate`.

Why layers around the server's protocol instead of options of the server: neither asyncio nor
aiohttp caps connections, and aiohttp has no deadline for the first request's headers (its keep-alive
timer, which this module sets to the idle timeout, is the only clock it runs). And with TLS,
asyncio hands the application a connection only once the handshake completed, so a connection that
never finishes it is invisible above TLS: the gate must count it below, at the raw socket.

* plain: :class:`HeaderWatch` is the socket's protocol; it takes a place at the gate when the
  connection is made and forwards everything to the server's protocol;
* TLS: :class:`GatedTls` (asyncio's own TLS layer with a smaller read buffer) is the socket's
  protocol and takes the place; its application protocol is the :class:`HeaderWatch`.

Either way the watch closes the connection unless the first request's header block ends within the
header timeout, and tells the gate when it did (the connection is then no longer a candidate for
eviction).
"""

from __future__ import annotations

import asyncio
import ssl
from asyncio.sslproto import SSLProtocol
from collections.abc import Callable

from gpupool.netguard.gate import Admitted, ConnectionGate
from gpupool.netguard.limits import ServerLimits

_HEADER_ENDS = (b"\r\n\r\n", b"\n\n")
TLS_READ_BUFFER = 32 * 1024
"""asyncio reads TLS into a 256 KiB buffer allocated per connection, before the handshake: most of
the ~240 KB per silent connection measured in issue 28. A TLS record is at most 16 KiB."""


class HeaderWatch(asyncio.Protocol):
    """Forwards to the server's protocol, made only once the connection is admitted (and, under TLS,
    its handshake done: a silent connection costs no HTTP parser); closes the connection if its
    first header block is late."""

    def __init__(self, server: Callable[[], asyncio.Protocol], gate: ConnectionGate, header_timeout_s: float,
                 owns_place: bool = True) -> None:
        """``owns_place``: take the gate's place here (plain); else the TLS layer below holds it and
        hands it over through :attr:`admitted` before the handshake starts."""
        self._server = server
        self._inner: asyncio.Protocol | None = None
        self._gate = gate
        self._timeout_s = header_timeout_s
        self.admitted: Admitted | None = None
        self._owns_place = owns_place
        self._tail = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._owns_place:
            self.admitted = self._gate.admit(transport.abort)  # type: ignore[attr-defined]
            if self.admitted is None:
                transport.abort()  # type: ignore[attr-defined]
                return
        self._inner = self._server()
        self._timer = asyncio.get_running_loop().call_later(self._timeout_s, self._late)
        self._inner.connection_made(transport)

    def _late(self) -> None:
        self._timer = None
        if self.admitted is not None:
            self._gate.time_out(self.admitted)  # closes the raw connection

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if any(end in seen for end in _HEADER_ENDS):
                self._timer.cancel()
                self._timer = None
                if self.admitted is not None:
                    self._gate.activate(self.admitted)
            else:
                self._tail = seen[-3:]
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._owns_place and self.admitted is not None:
            self._gate.release(self.admitted)
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.connection_lost(exc)


class GatedTls(SSLProtocol):
    """asyncio's server-side TLS layer, holding a place at the gate from accept to close."""

    max_size = TLS_READ_BUFFER

    def __init__(self, loop: asyncio.AbstractEventLoop, watch: HeaderWatch, context: ssl.SSLContext,
                 gate: ConnectionGate, handshake_timeout_s: float) -> None:
        self._watch = watch
        self._gate = gate
        self._place: Admitted | None = None
        # typeshed's stub says the waiter is required and the timeout an int; asyncio takes None and a float
        super().__init__(loop, watch, context, None, server_side=True,  # type: ignore[arg-type]
                         ssl_handshake_timeout=handshake_timeout_s)  # type: ignore[arg-type]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._place = self._gate.admit(transport.abort)  # type: ignore[attr-defined]
        if self._place is None:
            transport.abort()  # type: ignore[attr-defined]
            return
        self._watch.admitted = self._place
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._place is None:
            return  # refused: never started
        self._gate.release(self._place)
        super().connection_lost(exc)


def gated_factory(server: Callable[[], asyncio.Protocol], gate: ConnectionGate, limits: ServerLimits,
                  context: ssl.SSLContext | None) -> Callable[[], asyncio.BaseProtocol]:
    """The protocol factory to give ``loop.create_server`` (with ``ssl=None``: TLS is done here)."""
    loop = asyncio.get_running_loop()

    def plain() -> asyncio.BaseProtocol:
        return HeaderWatch(server, gate, limits.header_timeout_s)

    def tls() -> asyncio.BaseProtocol:
        assert context is not None
        watch = HeaderWatch(server, gate, limits.header_timeout_s, owns_place=False)
        return GatedTls(loop, watch, context, gate, limits.handshake_timeout_s)

    return plain if context is None else tls
