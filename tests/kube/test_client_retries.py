"""One API call is one request: the client never retries on its own, so callers' deadlines hold.

urllib3's default (three retries of a read that timed out) let one GET of the binder take four
times its timeout, past the bind's deadline and kube-scheduler's httpTimeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kubernetes import client

from gpupool.kube.client_config import api_configuration
from gpupool.kube.podapi import KubePodApi, NoAnswerError

STALL_S = 1.0
TIMEOUT_S = 0.2


class _StallingApiserver(BaseHTTPRequestHandler):
    """Answers nothing in time: every request waits longer than the client's timeout."""

    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        time.sleep(STALL_S)
        self.send_response(504)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return


@pytest.fixture
def stalling_server() -> Iterator[tuple[str, type[_StallingApiserver]]]:
    handler = type("Handler", (_StallingApiserver,), {"hits": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return str(path)


@pytest.mark.slow
def test_a_read_that_times_out_is_sent_once(tmp_path: Path,
                                            stalling_server: tuple[str, type[_StallingApiserver]]) -> None:
    url, handler = stalling_server
    core = client.CoreV1Api(client.ApiClient(api_configuration(_kubeconfig(tmp_path, url))))
    with pytest.raises(NoAnswerError):
        KubePodApi(core, request_timeout_s=TIMEOUT_S).get_pod("ns", "p")
    time.sleep(STALL_S)  # let any retry that was sent arrive
    assert handler.hits == 1


@pytest.mark.slow
def test_a_read_given_less_time_than_the_client_timeout_gives_up_then(
        tmp_path: Path, stalling_server: tuple[str, type[_StallingApiserver]]) -> None:
    """The binder passes what is left of its deadline: the read must not wait the client's whole
    timeout (here 30 s) when the caller has 0.2 s."""
    url, handler = stalling_server
    core = client.CoreV1Api(client.ApiClient(api_configuration(_kubeconfig(tmp_path, url))))
    began = time.monotonic()
    with pytest.raises(NoAnswerError):
        KubePodApi(core, request_timeout_s=30.0).get_pod("ns", "p", timeout_s=TIMEOUT_S)
    assert time.monotonic() - began < STALL_S  # the server answers after STALL_S: it was not waited for
    assert handler.hits == 1
