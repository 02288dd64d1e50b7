"""What one listening port allows: how many connections at once and how long each may stay silent.

Why these four: memory grows with the connections a port holds, so the cap bounds it whatever a
client does (docs/security.md, "Bounded servers"); a connection is silent in three places, each with
its own clock: before its TLS handshake completes, before its first request's headers end, and
between two requests on a kept-alive connection. The first two are short (a real client sends at
once); the third is longer than the idle timeout of Go's HTTP client (90 s) so that kube-scheduler,
not the extender, closes an idle connection and never races a request against the close.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_CONNECTIONS = 512
"""Connections one port holds at once (kube-scheduler, probes and Prometheus use a handful)."""
DEFAULT_HANDSHAKE_TIMEOUT_S = 5.0
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ServerLimits:
    """The caps and timeouts of one port (the same values serve every port of a process)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    """A TLS handshake not finished by then is dropped (plain ports have none)."""
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    """The first request's headers must have arrived by then (counted after the handshake)."""
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    """A kept-alive connection without a complete next request by then is closed."""

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max connections {self.max_connections}: at least 1 is needed")
        for name in ("handshake_timeout_s", "header_timeout_s", "idle_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name.removesuffix('_s').replace('_', ' ')} must be longer than 0 s")
