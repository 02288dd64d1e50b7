"""A TCP relay that the test can cut, black-hole and heal: a network partition on loopback.

Why: the fail-over e2e kills the leader's process, but a *live* leader cut from the apiserver is
the harder case: it keeps serving kube-scheduler and must stop binding on its own clock, and the
writes it sent just before the cut may still be on the wire. The leader's kubeconfig points here
(TLS passes through untouched: the apiserver's certificate names 127.0.0.1, ports are not part of
it), and the test switches the relay between three states:

* ``open``: bytes flow both ways;
* ``cut``: every relayed connection is closed (RST) and new ones are reset at once, what a host
  whose route is withdrawn or whose peer rejects it sees (the client learns at once);
* ``black hole``: connections are accepted and kept, but no byte is forwarded either way; what a
  real partition looks like, since TCP does not notice a silent path (the client learns only from
  its own time-outs). Bytes read from a side while black-holed are *held* and delivered when the
  relay heals, as TCP's retransmissions would deliver them once the path is back: a request the
  client gave up on can still reach the server late. ``held`` counts such deliveries.

``heal`` returns to ``open``. Each relayed direction is one thread; the relay is for one test's
handful of connections, not for load.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections import Counter

OPEN, CUT, BLACK_HOLE = "open", "cut", "black hole"


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), as a refused or torn-down path looks to the peer."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class PartitionProxy:
    """Relays 127.0.0.1:``port`` to ``upstream`` (``host:port``) until cut or black-holed."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.state = OPEN
        self.stats: Counter[str] = Counter()
        """``accepted``, ``reset`` (refused while cut), ``torn`` (closed by a cut), ``held``
        (chunks read while black-holed and delivered on heal), ``held_to_server`` (of those, sent
        towards the apiserver: requests that arrive late)."""
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])

    @property
    def server(self) -> str:
        """The apiserver URL a client behind this relay uses."""
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> PartitionProxy:
        threading.Thread(target=self._accept, name="partition-proxy", daemon=True).start()
        return self

    def cut(self) -> None:
        """Tear every relayed connection down and reset new ones until :meth:`heal`."""
        with self._lock:
            self.state = CUT
            pairs = list(self._pairs)
            self._pairs.clear()
        self._flowing.set()  # relays blocked on a black hole wake up and find their sockets closed
        for client, upstream in pairs:
            self.stats["torn"] += 1
            _reset(client)
            _reset(upstream)

    def black_hole(self) -> None:
        """Keep connections, forward nothing (held until :meth:`heal`); accept new ones the same way."""
        with self._lock:
            self.state = BLACK_HOLE
            self._flowing.clear()

    def heal(self) -> None:
        with self._lock:
            self.state = OPEN
            self._flowing.set()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                state = self.state
            if state == CUT:
                self.stats["reset"] += 1
                _reset(client)
                continue
            self.stats["accepted"] += 1
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        """Dial the apiserver once bytes may flow (a black hole dials nothing: the SYN is lost)."""
        self._flowing.wait()
        with self._lock:
            if self.state == CUT or self._stop.is_set():
                _reset(client)
                return
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            _reset(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._pairs.add((client, upstream))
        threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
        threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if not self._flowing.is_set():  # black-holed: hold the bytes until the path heals
                    self._flowing.wait()
                    if self.state == CUT:
                        break
                    self.stats["held"] += 1
                    if not from_server:
                        self.stats["held_to_server"] += 1
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)  # pass the end of the stream on, as TCP would
