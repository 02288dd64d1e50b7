"""A Service in miniature: one loopback address that relays HTTP requests to the *Ready* backends only.

Why: in a cluster kube-scheduler reaches the extender replicas through a Service, whose endpoints
are the pods whose readinessProbe (``/readyz``) passes; kube-proxy spreads the connections over
them. The fail-over test needs that routing without a kubelet or kube-proxy: this front probes each
backend's ``/readyz`` every ``probe_s`` (deploy/'s readinessProbe runs every second) and relays each
request to the next Ready backend in turn. With none Ready it answers 503, as a Service without
endpoints refuses the connection. It also counts the answers that say "not the leader", which is
what the test holds to zero.
"""

from __future__ import annotations

import http.client
import itertools
import threading
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ReadyFront:
    """Relays POSTs on 127.0.0.1:``port`` to whichever of ``backends`` (``host:port``) are Ready."""

    def __init__(self, backends: list[tuple[str, str]], probe_s: float = 1.0, timeout_s: float = 15.0) -> None:
        """``backends``: (address ``host:port`` of the verbs, URL of ``/readyz``) per replica."""
        self.backends = backends
        self.probe_s = probe_s
        self.timeout_s = timeout_s
        self.ready: tuple[str, ...] = ()
        self.stats: Counter[str] = Counter()
        """Answers by kind: ``relayed``, ``no_endpoint`` (503), ``unreachable`` (502), ``not_leader``."""
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._stop = threading.Event()
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kube-scheduler keeps its connections open

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, data = front.relay(self.path, body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                return None  # kube-scheduler restarting drops its kept-alive connections: not news

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ReadyFront:
        self.probe_once()
        threading.Thread(target=self._server.serve_forever, name="ready-front", daemon=True).start()
        threading.Thread(target=self._probe, name="ready-front-probe", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def probe_once(self) -> tuple[str, ...]:
        """Probe every backend now; the Ready ones become the endpoints."""
        ready = []
        for address, ready_url in self.backends:
            try:
                with urllib.request.urlopen(ready_url, timeout=self.probe_s) as resp:
                    if resp.status == 200:
                        ready.append(address)
            except (OSError, urllib.error.URLError):
                pass
        with self._lock:
            self.ready = tuple(ready)
        return self.ready

    def _probe(self) -> None:
        while not self._stop.wait(self.probe_s):
            self.probe_once()

    def relay(self, path: str, body: bytes) -> tuple[int, bytes]:
        """The status and body the request gets from a Ready backend (or this front)."""
        with self._lock:
            ready = self.ready
            turn = next(self._turn)
        if not ready:
            self._count("no_endpoint")
            return 503, b'{"Error": "no ready endpoint"}'
        host, _, port = ready[turn % len(ready)].rpartition(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=self.timeout_s)
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            status, data = response.status, response.read()
        except OSError:
            self._count("unreachable")
            return 502, b'{"Error": "endpoint unreachable"}'
        finally:
            connection.close()
        self._count("relayed")
        if b"not the leader" in data:
            self._count("not_leader")
        return status, data

    def _count(self, kind: str) -> None:
        with self._lock:
            self.stats[kind] += 1
