"""The GPU quota admission webhook called by the real kube-apiserver (v1.37.2) over TLS.

The extender serves ``/admission/pods`` on ``--admission-port`` with a serving certificate for
127.0.0.1 from a CA of the test; a ValidatingWebhookConfiguration (the shipped one's rules and
policies, with ``clientConfig.url`` and that CA as ``caBundle``, limited to the test's namespace by
a label) makes the apiserver call it. A pod over its namespace's GpuQuota is refused by the API
with the filter's reason; a pod within the limit is created.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard
from gpupool.extender.http.certificates import issue_ca, issue_leaf
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e import test_tenancy_e2e
from tests.e2e.e2e_support import MakeNode, free_port
from tests.e2e.test_tenancy_e2e import gpu_quota, pod
from tests.e2e.trust_support import FlaggedExtender

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "kustomize" / "components" / "quota-webhook" / \
    "webhook.yaml"
OVER = "GpuQuota {ns}/gpus: whole GPUs limit 1, used 0, asked 2"

crds = test_tenancy_e2e.crds  # the fixture: deploy/crds/ installed and Established for this module


@pytest.fixture(scope="module")
def webhook_extender(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory,
                     crds: None) -> Iterator[tuple[FlaggedExtender, bytes]]:
    """The extender with its admission port; the CA the apiserver must trust."""
    base = tmp_path_factory.mktemp("webhook")
    ca = issue_ca("e2e-webhook-ca")
    leaf = issue_leaf(ca, "gpupool-extender", server=True, hosts=("127.0.0.1",))
    (base / "tls.crt").write_bytes(leaf.cert_pem)
    (base / "tls.key").write_bytes(leaf.key_pem)
    port = free_port()
    extender = FlaggedExtender(control_plane.kubeconfig, base / "extender.log", tls=True, extra_args=(
        "--tls-cert-file", str(base / "tls.crt"), "--tls-private-key-file", str(base / "tls.key"),
        "--admission-port", str(port)))
    extender.admission_port = port  # type: ignore[attr-defined]
    extender.start()
    try:
        yield extender, ca.cert_pem
    finally:
        extender.kill()


def webhook_configuration(name: str, url: str, ca_pem: bytes, selector: dict[str, str]) -> dict[str, Any]:
    """The shipped configuration's quota webhook (the first; the tenancy ones have their own test),
    pointed at ``url`` and limited to namespaces labelled ``selector``."""
    shipped = yaml.safe_load(SHIPPED.read_text())
    hook = shipped["webhooks"][0]
    assert hook["name"] == "pods.quota.gpupool.io"
    shipped["webhooks"] = [hook]
    hook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca_pem).decode()}
    hook["namespaceSelector"] = {"matchLabels": selector}
    shipped["metadata"] = {"name": name}
    return dict(shipped)


@pytest.fixture
def registered(kube_api_client: client.ApiClient, core_v1: client.CoreV1Api, namespace: str,
               webhook_extender: tuple[FlaggedExtender, bytes]) -> Iterator[str]:
    """The webhook registered for ``namespace``; yields the namespace."""
    extender, ca_pem = webhook_extender
    selector = {"gpupool-e2e-webhook": uuid.uuid4().hex[:8]}
    core_v1.patch_namespace(namespace, {"metadata": {"labels": selector}})
    admission = client.AdmissionregistrationV1Api(kube_api_client)
    name = f"gpupool-quota-{selector['gpupool-e2e-webhook']}"
    port = extender.admission_port  # type: ignore[attr-defined]
    admission.create_validating_webhook_configuration(
        webhook_configuration(name, f"https://127.0.0.1:{port}/admission/pods", ca_pem, selector))
    try:
        yield namespace
    finally:
        admission.delete_validating_webhook_configuration(name)


def refusal(core_v1: client.CoreV1Api, namespace: str, body: dict[str, Any], dry_run: bool = False) -> str | None:
    """The API's refusal of creating ``body`` (None: created)."""
    try:
        core_v1.create_namespaced_pod(namespace, body, dry_run="All" if dry_run else None)
    except ApiException as exc:
        return f"{exc.status} {exc.body}"
    return None


@pytest.mark.compat
def test_the_apiserver_rejects_a_pod_over_its_quota_through_the_webhook(
        registered: str, core_v1: client.CoreV1Api, kube_api_client: client.ApiClient,
        make_node: MakeNode) -> None:
    ns = registered
    name = f"wh-{uuid.uuid4().hex[:6]}"
    cards = tuple(GpuCard(i, f"GPU-{name}-{i}", "Tesla-T4", 16_384) for i in range(4))
    make_node(name, {"cpu": "16", "memory": "64Gi", "pods": "110"},
              annotations={NAMES.inventory: encode_inventory(Inventory(cards))})
    gpu_quota(client.CustomObjectsApi(kube_api_client), ns, {"hard": {"wholeGpus": 1}})
    # the apiserver's webhook informer and the extender's quota watch both take a moment: ask with
    # dry runs (the webhook has no side effects, so it is called for them) until the pod is refused
    deadline, found = time.monotonic() + 30, None
    while time.monotonic() < deadline:
        found = refusal(core_v1, ns, pod("probe", whole=2), dry_run=True)
        if found is not None:
            break
        time.sleep(0.3)
    assert found is not None, "the webhook never refused a pod over the quota"
    started = time.perf_counter()
    over = refusal(core_v1, ns, pod("over", whole=2))
    took = time.perf_counter() - started
    assert over is not None and over.startswith("403 ")
    assert 'admission webhook \\"pods.quota.gpupool.io\\" denied the request: ' + OVER.format(ns=ns) in over, over
    assert refusal(core_v1, ns, pod("within", whole=1)) is None
    assert core_v1.read_namespaced_pod("within", ns).metadata.name == "within"
    assert refusal(core_v1, ns, pod("cpu-only", core=0) | {"spec": {"containers": [
        {"name": "main", "image": "busybox"}]}}) is None
    print(f"\nrejected create round trip through the webhook: {took * 1000:.1f} ms")
