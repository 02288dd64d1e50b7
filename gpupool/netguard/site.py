"""An aiohttp site (one listening TCP port) under :class:`ServerLimits`.

Use it where ``web.TCPSite`` was: ``await BoundedSite(runner, host, port, limits, ssl_context).start()``,
with the runner made by :func:`bounded_runner` (it sets aiohttp's keep-alive timer to the idle
timeout). TLS is done by the gate's own layer (:mod:`.protocols`), so aiohttp is given none.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from aiohttp import web

from gpupool.netguard.gate import ConnectionGate
from gpupool.netguard.limits import ServerLimits
from gpupool.netguard.protocols import gated_factory
from gpupool.netguard.summary_log import SummaryLog

log = logging.getLogger(__name__)

BACKLOG = 128
"""Connections the kernel queues before they are accepted, which is also the most asyncio accepts in
one turn of its loop: each accepted connection holds its TLS layer until the gate decides, so a
larger batch raises the peak memory of a flood (aiohttp's default)."""

def bounded_runner(app: web.Application, limits: ServerLimits, **kwargs: Any) -> web.AppRunner:
    """``web.AppRunner`` whose connections close after ``limits.idle_timeout_s`` between requests."""
    return web.AppRunner(app, keepalive_timeout=limits.idle_timeout_s, **kwargs)


class BoundedSite(web.BaseSite):
    """One TCP port whose connections pass a :class:`ConnectionGate`; :attr:`gate` counts them."""

    __slots__ = ("_bound_port", "_events", "_host", "_limits", "_port", "_tls", "gate")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: ServerLimits,
                 ssl_context: ssl.SSLContext | None = None, name: str = "") -> None:
        super().__init__(runner, backlog=BACKLOG)
        self._host, self._port, self._limits, self._tls = host, port, limits, ssl_context
        self._bound_port: int | None = None
        what = f"connections to {name or 'port'} {port}"
        self._events = SummaryLog(log, what)
        self.gate = ConnectionGate(limits.max_connections, notify=self._note)

    def _note(self, kind: str) -> None:
        self._events.note(kind, "%s :%d: a connection %s (%d open, cap %d; docs/security.md, Bounded servers)",
                          "TLS" if self._tls else "HTTP", self.port, kind, self.gate.open,
                          self.gate.max_connections)

    @property
    def port(self) -> int:
        """The port listened on (the one the kernel chose when 0 was asked)."""
        return self._bound_port if self._bound_port is not None else self._port

    @property
    def name(self) -> str:
        return f"{'https' if self._tls else 'http'}://{self._host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        factory = gated_factory(server, self.gate, self._limits, self._tls)
        self._server = await asyncio.get_running_loop().create_server(
            factory, self._host, self._port, backlog=self._backlog, reuse_address=True)
        sockets = self._server.sockets if isinstance(self._server, asyncio.Server) else ()
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port

    async def stop(self) -> None:
        self._events.flush()
        await super().stop()
