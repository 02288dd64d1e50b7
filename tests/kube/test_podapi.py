"""KubePodApi over the official client against a tiny local HTTP server: connections are reused."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client

from gpupool.kube.podapi import ConflictError, KubePodApi, NoAnswerError


class _Apiserver(ThreadingHTTPServer):
    """Answers Binding POSTs and merge PATCHes like the apiserver; counts TCP connections."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.bound: set[str] = set()
        self.patch_delay_s = 0.0
        self.post_delay_s = 0.0
        self.posted: list[dict[str, object]] = []
        self.authorizations: list[str | None] = []

    def process_request(self, request: object, client_address: object) -> None:
        self.connections += 1
        super().process_request(request, client_address)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the apiserver
    wbufsize = 1 << 16  # headers and body in one segment (else delayed ACKs add 40 ms per call)

    def log_message(self, *_: object) -> None:
        pass

    def _answer(self, status: int, doc: dict[str, object]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        server = self.server
        assert isinstance(server, _Apiserver)
        server.posted.append(json.loads(body))
        server.authorizations.append(self.headers.get("Authorization"))
        time.sleep(server.post_delay_s)
        if self.path in server.bound:
            self._answer(409, {"kind": "Status", "code": 409, "message": "already assigned"})
            return
        server.bound.add(self.path)
        self._answer(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})

    def do_PATCH(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        server = self.server
        assert isinstance(server, _Apiserver)
        time.sleep(server.patch_delay_s)
        self._answer(200, {"metadata": {"name": "p", "resourceVersion": "2"}})


@pytest.fixture
def apiserver() -> Iterator[_Apiserver]:
    server = _Apiserver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def kube_api(server: _Apiserver, patch_timeout_s: float | None = None) -> KubePodApi:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    return KubePodApi(client.CoreV1Api(client.ApiClient(configuration)), patch_timeout_s=patch_timeout_s)


@pytest.mark.slow
def test_binds_and_patches_reuse_one_connection(apiserver: _Apiserver) -> None:
    """An unread Binding answer kept its connection out of the pool: every bind paid a new TCP (and,
    against a real apiserver, TLS) handshake, which capped binds/s. One sequential client, one
    connection."""
    api = kube_api(apiserver)
    for i in range(6):
        api.patch_pod_annotations("default", f"p{i}", "1", {"gpupool.io/assignment-v1": "{}"})
        api.bind_pod("default", f"p{i}", "", "n1")
    assert apiserver.connections == 1


@pytest.mark.slow
def test_a_conflicting_bind_is_a_conflict_error_and_keeps_the_connection(apiserver: _Apiserver) -> None:
    api = kube_api(apiserver)
    api.bind_pod("default", "p", "", "n1")
    with pytest.raises(ConflictError):
        api.bind_pod("default", "p", "", "n2")
    api.bind_pod("default", "q", "", "n1")
    assert apiserver.connections == 1


@pytest.mark.slow
def test_the_assignment_write_gives_up_after_its_own_timeout(apiserver: _Apiserver) -> None:
    """A leader's write must be over before another replica may acquire the Lease: the PATCH is
    bounded by the commit timeout, and no answer is a typed error (not a raw urllib3 exception that
    would leave the bind's reservation in flight forever)."""
    api = kube_api(apiserver, patch_timeout_s=0.3)
    apiserver.patch_delay_s = 2.0
    started = time.monotonic()
    with pytest.raises(NoAnswerError):
        api.patch_pod_annotations("default", "p", "1", {"gpupool.io/assignment-v1": "{}"})
    assert time.monotonic() - started < 1.5
    apiserver.patch_delay_s = 0.0
    api.bind_pod("default", "p", "", "n1")  # the other calls keep their longer timeout


@pytest.mark.slow
def test_a_binding_carries_the_assignment_and_the_preconditions(apiserver: _Apiserver) -> None:
    """The apiserver merges a Binding's annotations into the pod as it binds it; uid and
    resourceVersion are the preconditions apiservers from v1.23 check."""
    api = kube_api(apiserver)
    api.bind_pod("default", "p", "uid-p", "n1", annotations={"gpupool.io/assignment-v1": "{}"},
                 resource_version="7")
    api.bind_pod("default", "q", "", "n1")
    assert apiserver.posted == [
        {"apiVersion": "v1", "kind": "Binding",
         "metadata": {"name": "p", "namespace": "default", "uid": "uid-p", "resourceVersion": "7",
                      "annotations": {"gpupool.io/assignment-v1": "{}"}},
         "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}},
        {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "q", "namespace": "default"},
         "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}},
    ]


@pytest.mark.slow
def test_a_binding_that_carries_the_assignment_gives_up_after_the_commit_timeout(apiserver: _Apiserver) -> None:
    """That Binding is the assignment write: like the PATCH, it must be over before another replica
    may take the Lease. A Binding without annotations keeps the longer timeout."""
    api = kube_api(apiserver, patch_timeout_s=0.3)
    apiserver.post_delay_s = 0.6
    started = time.monotonic()
    with pytest.raises(NoAnswerError):
        api.bind_pod("default", "p", "uid-p", "n1", annotations={"gpupool.io/assignment-v1": "{}"})
    assert time.monotonic() - started < 0.55
    api.bind_pod("default", "q", "uid-q", "n1")  # answered after 0.6 s: within the longer timeout


@pytest.mark.slow
def test_a_binding_carries_the_current_token(apiserver: _Apiserver) -> None:
    """The Binding skips the generated client method, not its credentials: the token goes with each
    POST, and the client's refresh hook (exec plugins, rotated service-account tokens) runs first."""
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{apiserver.server_address[1]}"
    configuration.api_key = {"authorization": "Bearer first"}
    tokens = iter(["Bearer second", "Bearer third"])

    def refresh(config: client.Configuration) -> None:
        config.api_key["authorization"] = next(tokens)

    configuration.refresh_api_key_hook = refresh
    api = KubePodApi(client.CoreV1Api(client.ApiClient(configuration)))
    api.bind_pod("default", "p", "", "n1")
    api.bind_pod("default", "q", "", "n1")
    assert apiserver.authorizations == ["Bearer second", "Bearer third"]


@pytest.mark.slow
def test_a_refused_binding_is_an_api_error_with_the_apiservers_message(apiserver: _Apiserver) -> None:
    api = kube_api(apiserver)
    api.bind_pod("default", "p", "", "n1")
    with pytest.raises(ConflictError, match="already assigned"):
        api.bind_pod("default", "p", "", "n2")
