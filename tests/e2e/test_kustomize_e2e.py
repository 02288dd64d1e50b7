"""Every overlay of deploy/kustomize through ``kubectl apply --dry-run=server`` on the real apiserver.

The real kubectl (it carries kustomize) renders each overlay and sends it to the kube-apiserver under test
with server-side dry run: the server validates and defaults each object as if creating it (RBAC,
NetworkPolicy, Jobs, the workloads, the namespaces' labels) and stores nothing. Every field an
object sets must come back (an apiserver drops fields it does not know, silently, unless asked to
be strict). gpupool's namespaces are created for real first (a namespaced object cannot be dry-run
into a namespace that does not exist) and deleted after.
Not sent (NOT_SENT): cert-manager's Issuer and Certificate, because cert-manager and its CRDs are not
installed in the test environment; tests/deploy/test_kustomize.py checks those objects.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpupool.testenv.controlplane import ControlPlane
from tests.deploy.kustomize_render import OVERLAYS, render
from tests.e2e.conftest import delete_namespace
from tests.e2e.test_deploy_e2e import lost_fields

pytestmark = pytest.mark.e2e

#: Kinds the overlays ship that are not sent to the test's apiserver, and why (module docstring).
NOT_SENT = {("cert-manager.io/v1", "Issuer"): "cert-manager's; its CRDs are not installed here",
            ("cert-manager.io/v1", "Certificate"): "cert-manager's; its CRDs are not installed here"}
#: What each overlay must leave out, no more (a new kind is sent, or named here with its reason).
LEFT_OUT: dict[str, set[tuple[str, str]]] = {
    "production": set(), "dev": set(),
    "production-cert-manager": {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}}
KUBECTL_TIMEOUT_S = 120


def kubectl(plane: ControlPlane, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(plane.binaries.kubectl), "--kubeconfig", str(plane.kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S, check=False)


@pytest.fixture(scope="module")
def gpupool_namespaces(kube_api_client: client.ApiClient) -> Iterator[None]:
    """gpupool's namespaces, as the base declares them, for real."""
    core_v1 = client.CoreV1Api(kube_api_client)
    namespaces = [d for d in render("overlays/production") if d["kind"] == "Namespace"]
    try:
        for namespace in namespaces:
            core_v1.create_namespace(namespace)
        yield
    finally:
        for namespace in namespaces:
            delete_namespace(core_v1, namespace["metadata"]["name"])


def dry_run(plane: ControlPlane, docs: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    return kubectl(plane, "apply", "--dry-run=server", "-o", "json", "-f", "-", stdin=yaml.safe_dump_all(docs))


def by_identity(answer: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    parsed = json.loads(answer)
    items = parsed["items"] if parsed.get("kind") == "List" else [parsed]
    return {(i["kind"], i["metadata"].get("namespace", ""), i["metadata"]["name"]): i for i in items}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_passes_server_side_dry_run_without_losing_fields(
    overlay: str, control_plane: ControlPlane, kube_api_client: client.ApiClient, gpupool_namespaces: None,
) -> None:
    docs = render(f"overlays/{overlay}")
    left_out = {(d["apiVersion"], d["kind"]) for d in docs} & NOT_SENT.keys()
    assert left_out == LEFT_OUT[overlay]
    sent = [d for d in docs if (d["apiVersion"], d["kind"]) not in NOT_SENT]
    result = dry_run(control_plane, sent)
    assert result.returncode == 0, result.stderr
    answers = by_identity(result.stdout)
    assert len(answers) == len(sent)
    for doc in sent:
        answer = answers[(doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])]
        assert lost_fields(doc, answer) == [], (doc["kind"], doc["metadata"]["name"])
    apps = client.AppsV1Api(kube_api_client)  # a dry run stores nothing
    assert apps.list_namespaced_deployment("gpupool-system").items == []
    assert apps.list_namespaced_daemon_set("gpupool-node").items == []


def test_the_dry_run_refuses_what_the_server_would_refuse(
    control_plane: ControlPlane, gpupool_namespaces: None, tmp_path: Path,
) -> None:
    """The check itself: an invalid value is a refusal by the server, not a silent pass."""
    (policy,) = [d for d in render("overlays/production") if d["kind"] == "NetworkPolicy"]
    policy["spec"]["ingress"][0]["from"][1]["ipBlock"]["cidr"] = "control-plane"
    result = dry_run(control_plane, [policy])
    assert result.returncode != 0 and "cidr" in result.stderr, result.stderr
