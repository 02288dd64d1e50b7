"""The shipped Service in miniature: endpoints chosen by pod label and readiness, routed per connection.

Why: deploy/ routes kube-scheduler to the extender through a Service that selects the pod labelled
``gpupool.io/extender-leader: "true"`` among the Ready replicas (readiness is ``/syncz``: every
synced replica), and kube-proxy forwards *connections*, not requests: a connection kube-scheduler
keeps open stays with the replica it reached, even after that replica left the Service's endpoints
(conntrack keeps the flow), until one side closes it. The fail-over e2e needs exactly that routing
without kubelets or kube-proxy: this front reads the replicas' Pod objects' labels (as the
EndpointSlice controller does) and probes each replica's readiness every ``probe_s``, and relays
each accepted TCP connection, byte for byte, to one current endpoint (round robin); with none it
closes the connection at once, as a Service without endpoints rejects it. It counts connections by
outcome and the answers that say "not the leader", which the test reports and holds to zero.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import urllib.error
import urllib.request
from collections import Counter
from typing import Any

from gpupool.extender.leader_label import LEADER_LABEL

NOT_LEADER = b"not the leader"


class LabelService:
    """TCP on 127.0.0.1:``port`` to whichever replica is labelled the leader and Ready."""

    def __init__(self, core_v1: Any, namespace: str, backends: dict[str, tuple[str, str]],
                 probe_s: float = 0.5) -> None:
        """``backends``: per replica pod name, (its verbs' ``host:port``, its readiness URL)."""
        self.core_v1 = core_v1
        self.namespace = namespace
        self.backends = backends
        self.probe_s = probe_s
        self.endpoints: tuple[str, ...] = ()
        """The pod names the Service routes to now."""
        self.stats: Counter[str] = Counter()
        """``connections`` relayed, ``refused`` (no endpoint), ``unreachable`` (endpoint refused),
        ``not_leader`` (answers saying so), ``connections:<pod>`` per endpoint."""
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._stop = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LabelService:
        self.refresh()
        threading.Thread(target=self._accept, name="label-service", daemon=True).start()
        threading.Thread(target=self._refresh_loop, name="label-service-endpoints", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            open_sockets = list(self._sockets)
        for s in open_sockets:
            _close(s)

    # ------------------------------------------------------------------------------ endpoints
    def refresh(self) -> tuple[str, ...]:
        """The labelled replicas whose readiness answers 200 become the endpoints."""
        try:
            pods = self.core_v1.list_namespaced_pod(self.namespace, label_selector=f"{LEADER_LABEL}=true",
                                                    _request_timeout=self.probe_s * 4)
            labelled = {p.metadata.name for p in pods.items}
        except Exception:  # the API is slow: keep the endpoints we have, as kube-proxy would
            return self.endpoints
        ready = tuple(name for name, (_, ready_url) in sorted(self.backends.items())
                      if name in labelled and _ready(ready_url, self.probe_s))
        with self._lock:
            self.endpoints = ready
        return ready

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.probe_s):
            self.refresh()

    # ---------------------------------------------------------------------------- connections
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                endpoints, turn = self.endpoints, next(self._turn)
            if not endpoints:
                self._count("refused")
                _close(client)
                continue
            name = endpoints[turn % len(endpoints)]
            host, _, port = self.backends[name][0].rpartition(":")
            try:
                backend = socket.create_connection((host, int(port)), timeout=2)
            except OSError:
                self._count("unreachable")
                _close(client)
                continue
            backend.settimeout(None)
            self._count("connections")
            self._count(f"connections:{name}")
            with self._lock:
                self._sockets.update((client, backend))
            threading.Thread(target=self._pipe, args=(client, backend, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(backend, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        """Copy ``source`` to ``sink`` until either closes; then close both (a dead replica's
        connections end for kube-scheduler too). ``answers``: scan for "not the leader"."""
        tail = b""
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if answers:
                    seen = tail + data
                    self._count("not_leader", seen.count(NOT_LEADER))
                    tail = seen[-(len(NOT_LEADER) - 1):]
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                _close(s)
                with self._lock:
                    self._sockets.discard(s)

    def _count(self, kind: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self.stats[kind] += n


def _ready(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()
