"""Free loopback TCP ports, so that several environments (or a developer's own) can coexist."""

from __future__ import annotations

import socket
from contextlib import ExitStack


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Return ``count`` distinct TCP ports that are free on ``host`` right now.

    All sockets stay open until every port is chosen, so the kernel never hands out the same port
    twice. Another process can still take a port before our server binds it; callers retry the
    start-up with new ports when a component exits early (see :mod:`gpupool.testenv.controlplane`).
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    with ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def free_port(host: str = "127.0.0.1") -> int:
    """One free TCP port on ``host`` (see :func:`free_ports`)."""
    return free_ports(1, host)[0]
