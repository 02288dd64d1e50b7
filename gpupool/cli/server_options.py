"""The command-line options of a server's connection cap and timeouts, shared by ``gpupool extender``
and ``gpupool node-agent`` so both spell and default them the same way (docs/security.md, "Bounded
servers")."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from gpupool.netguard.limits import (
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    ServerLimits,
)

F = TypeVar("F", bound=Callable[..., Any])
_SECONDS = click.FloatRange(min=0, min_open=True)


def server_limit_options(tls: bool) -> Callable[[F], F]:
    """Add ``--max-connections``, ``--header-timeout``, ``--idle-timeout`` (and, for a server with a TLS
    port, ``--handshake-timeout``); the command receives them as one ``server_limits`` argument."""
    def decorate(command: F) -> F:
        @functools.wraps(command)
        def with_limits(*args: Any, max_connections: int, header_timeout: float, idle_timeout: float,
                        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT_S, **kwargs: Any) -> Any:
            limits = ServerLimits(max_connections, handshake_timeout, header_timeout, idle_timeout)
            return command(*args, server_limits=limits, **kwargs)

        options = [
            click.option("--max-connections", default=DEFAULT_MAX_CONNECTIONS, show_default=True,
                         type=click.IntRange(min=1),
                         help="Connections each HTTP port holds at once; past it a new one replaces the oldest that "
                              "has not sent a request yet, or is refused when all have."),
            click.option("--header-timeout", default=DEFAULT_HEADER_TIMEOUT_S, show_default=True, type=_SECONDS,
                         help="Seconds a new connection has to send its first request's headers"
                              + (" (after the TLS handshake)." if tls else ".")),
            click.option("--idle-timeout", default=DEFAULT_IDLE_TIMEOUT_S, show_default=True, type=_SECONDS,
                         help="Seconds a kept-alive connection may wait for its next request."),
        ]
        if tls:
            options.append(click.option("--handshake-timeout", default=DEFAULT_HANDSHAKE_TIMEOUT_S,
                                        show_default=True, type=_SECONDS,
                                        help="Seconds a connection to a TLS port has to finish its handshake."))
        decorated: Any = with_limits
        for option in reversed(options):
            decorated = option(decorated)
        return decorated  # type: ignore[no-any-return]
    return decorate
