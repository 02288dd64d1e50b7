"""A loopback TCP proxy whose answers arrive late: a component behind it sees the API's changes
(watch events included) ``lag_s`` after every other component does.

Why: races between two watchers of one apiserver (kube-scheduler and the extender) are decided by
milliseconds and show up in a few runs in a hundred; with the extender behind this proxy, the one
order that matters (kube-scheduler first) happens every time. TLS passes through untouched (bytes
are relayed, not read), so the apiserver's certificate still names 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time

CHUNK = 65536


class LaggingProxy:
    """Relays 127.0.0.1:``port`` to ``upstream``; bytes to the upstream pass at once, bytes from it
    are held ``lag_s`` (in order)."""

    def __init__(self, upstream_port: int, lag_s: float) -> None:
        self.upstream_port = upstream_port
        self.lag_s = lag_s
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> LaggingProxy:
        threading.Thread(target=self._accept, name="lagging-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self._lock:
                self._sockets += [client, upstream]
            held: queue.Queue[tuple[float, bytes]] = queue.Queue()
            for target, args in ((self._pump, (client, upstream)), (self._hold, (upstream, held)),
                                 (self._release, (held, client))):
                threading.Thread(target=target, args=args, daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(CHUNK):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _hold(self, source: socket.socket, held: queue.Queue[tuple[float, bytes]]) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(CHUNK):
                held.put((time.monotonic() + self.lag_s, data))
        held.put((time.monotonic() + self.lag_s, b""))

    @staticmethod
    def _release(held: queue.Queue[tuple[float, bytes]], sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                due, data = held.get()
                time.sleep(max(0.0, due - time.monotonic()))
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
