"""Events about pods through the official client: the path, the body, and errors as typed errors."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from gpupool.kube.podapi import EVENT_SOURCE, ApiError, KubePodApi


class _Apiserver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.posted: list[tuple[str, dict[str, Any]]] = []
        self.status = 201


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: object) -> None:
        pass

    def do_POST(self) -> None:
        server = self.server
        assert isinstance(server, _Apiserver)
        server.posted.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
        body = json.dumps({"kind": "Status", "code": server.status, "message": "events are forbidden"}).encode()
        self.send_response(server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def apiserver() -> Iterator[_Apiserver]:
    server = _Apiserver()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def kube_api(server: _Apiserver) -> KubePodApi:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    return KubePodApi(client.CoreV1Api(client.ApiClient(configuration)))


@pytest.mark.slow
def test_an_event_names_the_pod_and_its_uid(apiserver: _Apiserver) -> None:
    kube_api(apiserver).create_pod_event("team-a", "train-0", "uid-1", "GpupoolCardOverCommitted", "card 0 ...")
    [(path, body)] = apiserver.posted
    assert path == "/api/v1/namespaces/team-a/events"
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a",
                                      "name": "train-0", "uid": "uid-1"}
    assert (body["reason"], body["message"], body["type"]) == ("GpupoolCardOverCommitted", "card 0 ...", "Warning")
    assert body["source"] == {"component": EVENT_SOURCE} and body["metadata"]["generateName"] == "train-0."
    assert body["firstTimestamp"] == body["lastTimestamp"] and body["count"] == 1


@pytest.mark.slow
def test_a_refused_event_is_an_api_error(apiserver: _Apiserver) -> None:
    apiserver.status = 403
    with pytest.raises(ApiError, match="HTTP 403 events are forbidden"):
        kube_api(apiserver).create_pod_event("default", "p", "", "R", "m")
