"""CertificateSigningRequests as the apiserver keeps them, for the remote GPU signer's tests.

``create`` records who asked (``spec.username`` and ``spec.extra``), as the apiserver does from the
requester's token; the requester cannot set them. Writes check ``resourceVersion`` (409 when stale).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpupool.api.remote_gpu_certs import NODE_NAME_EXTRA
from gpupool.extender.remote_gpu_signer import AGENT_USERNAME


class FakeCsrApi:
    """``CertificatesV1Api``'s create, read, approval and status calls, answering JSON."""

    def __init__(self, username: str = AGENT_USERNAME, node: str | None = "node-a") -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.username = username
        self.node = node
        """The node the requester's token names (None: a token bound to no pod)."""
        self.on_create: Callable[[dict[str, Any]], None] | None = None
        self.version = 0
        self.calls: list[str] = []

    def _bump(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        doc["metadata"]["resourceVersion"] = str(self.version)
        self.items[doc["metadata"]["name"]] = doc
        return copy.deepcopy(doc)

    def create_certificate_signing_request(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("create")
        name = body["metadata"]["name"]
        if name in self.items:
            raise ApiException(status=409, reason="AlreadyExists")
        doc = copy.deepcopy(body)
        doc["spec"]["username"] = self.username
        doc["spec"]["extra"] = {NODE_NAME_EXTRA: [self.node]} if self.node is not None else {}
        created = self._bump(doc)
        if self.on_create is not None:
            self.on_create(copy.deepcopy(created))
        return created

    def list_certificate_signing_request(self, field_selector: str = "", _preload_content: bool = True) -> Any:
        """The list as the raw answer (``_preload_content=False``): ``.data`` is its JSON."""
        self.calls.append(f"list {field_selector}")
        signer = field_selector.removeprefix("spec.signerName=")
        items = [copy.deepcopy(d) for d in self.items.values() if not signer or d["spec"]["signerName"] == signer]
        return SimpleNamespace(data=json.dumps({"items": items}).encode())

    def read_certificate_signing_request(self, name: str) -> dict[str, Any]:
        if name not in self.items:
            raise ApiException(status=404, reason="NotFound")
        return copy.deepcopy(self.items[name])

    def _replace(self, name: str, body: dict[str, Any], part: str) -> dict[str, Any]:
        self.calls.append(part)
        stored = self.items[name]
        if body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        doc = copy.deepcopy(stored)
        if part == "approval":
            doc["status"] = {**doc.get("status", {}), "conditions": copy.deepcopy(body["status"]["conditions"])}
        else:
            doc["status"] = {**doc.get("status", {}), "certificate": body["status"]["certificate"]}
        return self._bump(doc)

    def replace_certificate_signing_request_approval(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._replace(name, body, "approval")

    def replace_certificate_signing_request_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._replace(name, body, "status")


def node_json(name: str, *addresses: str, hostname: bool = True) -> dict[str, Any]:
    """A Node with InternalIP ``addresses`` (and its Hostname entry, which is not an address)."""
    entries = [{"type": "InternalIP", "address": a} for a in addresses]
    if hostname:
        entries.append({"type": "Hostname", "address": name})
    return {"metadata": {"name": name}, "status": {"addresses": entries}}


class FakeNodes:
    """``CoreV1Api.read_node`` answering raw JSON (``_preload_content=False``), 404 for no Node."""

    def __init__(self, nodes: dict[str, dict[str, Any]]) -> None:
        self.nodes = nodes

    def read_node(self, name: str, _preload_content: bool = True) -> Any:
        if name not in self.nodes:
            raise ApiException(status=404, reason="NotFound")
        return SimpleNamespace(data=json.dumps(self.nodes[name]).encode())
