"""gpupool chooses the node of DRA claim pods (issue 24, docs/dra.md "Choosing between the extender
path and the DRA path"), end to end on the default Kubernetes (v1.37.2).

Two GPU nodes of one 16 GiB card each (Node objects and the ResourceSlices gpupool's agent would
publish for them; no kubelet: the test is about where kube-scheduler puts the pods, and the DRA
allocator allocates at scheduling). Node A holds an 8 GiB claim whose pod asks for 6 CPUs, so
kube-scheduler's default scores (least allocated CPU and memory) prefer node B for anything new.

First, on the plain scheduler (the DRA path as it was), a 4 GiB claim's pod lands on B: the spread.
Then kube-scheduler is configured as gpupool's own (an extender with no ``managedResources``, so it
is asked about every pod; binder), the extender watching claims (``--dra-claims``): the next 4 GiB
claim's pod joins A's partly used card (8 GiB free there, against 12 on B), where gpupool's binpack
packs it, bound by the extender without an assignment. No card is ever allocated beyond its 16 GiB.

The webhook side (``--steer-claim-pods``, docs/dra.md "Steering claim pods"): the extender serves the
pod-scheduler webhook over TLS, registered as components/scheduler-webhook ships it with the claim
condition the chart adds for ``scheduler.claimPods``. Pods created without ``schedulerName`` whose
claim or claim template asks for gpupool's DeviceClass (exactly, or among ``firstAvailable``
alternatives) get ``gpupool-scheduler``; pods whose claim or template asks only for another driver's
DeviceClass keep ``default-scheduler``; a pod naming a claim that does not exist is steered (the
documented choice for an unknown claim). A claim of an admin's DeviceClass for gpupool's driver
(its selectors require the driver and an A100) steers too: the extender's DeviceClass watch
(gpupool/extender/gpupool_classes.py) read it from the real apiserver.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.dra import MIB
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard, Topology
from gpupool.extender.http.certificates import issue_ca, issue_leaf
from gpupool.extender.scheduler_steering import DEFAULT_SCHEDULER, GPUPOOL_SCHEDULER
from gpupool.kube.quantity import parse_quantity
from gpupool.nodeagent.dra.resource_slice import resource_slice
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.testenv.config import ExtenderConfig
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testing.kube_objects import node as gpu_node
from tests.e2e.dra_support import DRIVER, claim_manifest, dra_installed
from tests.e2e.e2e_support import MakeNode, free_port, wait_for
from tests.e2e.shipped_scheduler import write_files
from tests.e2e.test_own_scheduler_e2e import SELECTOR_KEY, webhook_configuration
from tests.e2e.trust_support import FlaggedExtender, filter_reason

pytestmark = pytest.mark.e2e

CARD_MIB = 16 * 1024
OTHER_CLASS = "nic.e2e.example.com"
"""Another DRA driver's DeviceClass (no driver publishes devices for it: no pod here is scheduled)."""
ADMIN_CLASS = "a100-share.e2e.example.com"
"""An admin's DeviceClass for gpupool's driver (A100 cards only): the extender's DeviceClass watch
counts it as gpupool's."""
CLAIM_CONDITION = " || (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)"
"""What the chart's scheduler.claimPods adds to the webhook's asks-for-gpupool-resources condition."""


def inventory(node: str) -> GpuInventory:
    card = GpuCard(index=0, uuid=f"GPU-{node}-0", model="Tesla-T4", memory_mib=CARD_MIB)
    return GpuInventory((card,), Topology.flat(1), ("/dev/nvidia0",))


def claim_pod(name: str, claim: str, nodes: tuple[str, str], cpu: str = "0", pinned: str = "") -> dict[str, Any]:
    """A pod using ``claim``, allowed on the test's two nodes only (or ``pinned`` to one)."""
    allowed = [pinned] if pinned else list(nodes)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "kubernetes.io/hostname", "operator": "In", "values": allowed}]}]}}},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"claims": [{"name": "gpu"}], "requests": {"cpu": cpu}}}]}}


@pytest.fixture
def two_gpu_nodes(make_node: MakeNode, kube_api_client: client.ApiClient) -> Iterator[tuple[str, str]]:
    """Nodes A and B with their slices and gpupool's DeviceClass (removed afterwards)."""
    suffix = uuid.uuid4().hex[:6]
    names = (f"steer-a-{suffix}", f"steer-b-{suffix}")
    for name in names:
        make_node(name, allocatable={"cpu": "8", "memory": "32Gi"},
                  annotations=gpu_node(name, [CARD_MIB])["metadata"]["annotations"])
    resource = client.ResourceV1Api(kube_api_client)
    with dra_installed(kube_api_client, names[0]):
        try:
            for name in names:
                resource.create_resource_slice(resource_slice(name, DRIVER, inventory(name), generation=1))
            yield names
        finally:
            for item in resource.list_resource_slice(field_selector=f"spec.nodeName={names[1]}").items:
                resource.delete_resource_slice(item.metadata.name)


def bound_node(core_v1: client.CoreV1Api, namespace: str, pod: str) -> str | None:
    return core_v1.read_namespaced_pod(pod, namespace).spec.node_name or None


def allocated_mib(api: client.ApiClient, namespace: str) -> dict[tuple[str, str], int]:
    """MiB allocated per (pool, device) over the namespace's claims."""
    held: dict[tuple[str, str], int] = defaultdict(int)
    for claim in client.ResourceV1Api(api).list_namespaced_resource_claim(namespace).items:
        obj = api.sanitize_for_serialization(claim)
        for result in (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results", []):
            if result.get("driver") == DRIVER:
                memory = (result.get("consumedCapacity") or {}).get("memory", f"{CARD_MIB}Mi")
                held[(result["pool"], result["device"])] += int(parse_quantity(memory) / MIB)
    return dict(held)


def test_a_small_claim_joins_the_partly_used_card_instead_of_the_node_default_scoring_prefers(
        control_plane: ControlPlane, two_gpu_nodes: tuple[str, str], kube_api_client: client.ApiClient,
        core_v1: client.CoreV1Api, namespace: str, tmp_path: Path) -> None:
    a, b = two_gpu_nodes
    resource = client.ResourceV1Api(kube_api_client)
    control_plane.restart_scheduler([])  # the plain scheduler: the DRA path as it was

    def placed(pod: str, claim: str, memory: str, **kw: Any) -> str:
        resource.create_namespaced_resource_claim(namespace, claim_manifest(claim, memory))
        core_v1.create_namespaced_pod(namespace, claim_pod(pod, claim, (a, b), **kw))
        return wait_for(lambda: bound_node(core_v1, namespace, pod), timeout=60, what=f"pod {pod} bound",
                        explain=lambda: str(core_v1.read_namespaced_pod(pod, namespace).status.conditions))

    assert placed("held", "held", "8Gi", cpu="6", pinned=a) == a
    assert placed("spread", "spread", "4Gi") == b, "default scoring spreads to the node with less CPU requested"

    extender = FlaggedExtender(control_plane.kubeconfig, tmp_path / "extender.log", extra_args=("--dra-claims",))
    extender.start()
    try:
        control_plane.restart_scheduler([ExtenderConfig(
            url_prefix=extender.url, filter_verb="filter", prioritize_verb=None, bind_verb="bind",
            node_cache_capable=True, managed_resources=(), http_timeout_s=10.0)])
        wait_for(lambda: filter_reason(extender, [("main", {"gpupool.io/gpu-mem": "4"})], a) is None, timeout=30,
                 what=f"node {a} in the extender's ledger ({extender.log_path})")
        assert placed("packed", "packed", "4Gi") == a, f"gpupool packs it beside the 8 GiB claim ({extender.log_path})"
        pod = core_v1.read_namespaced_pod("packed", namespace)
        assert ResourceNames().assignment not in (pod.metadata.annotations or {}), "the claim books it, not the bind"
        held = allocated_mib(kube_api_client, namespace)
        assert held == {(a, "gpu-0"): 12 * 1024, (b, "gpu-0"): 4 * 1024}
        assert all(mib <= CARD_MIB for mib in held.values())
    finally:
        extender.kill()
        control_plane.restart_scheduler([])


# ------------------------------------------------------------------------------- which pods are steered
def claim_spec(device_class: str, alternatives: tuple[str, ...] = ()) -> dict[str, Any]:
    """A claim's spec: one device of ``device_class``, or the first available of ``alternatives``."""
    if alternatives:
        request: dict[str, Any] = {"name": "dev", "firstAvailable": [
            {"name": f"alt{i}", "deviceClassName": c} for i, c in enumerate(alternatives)]}
    else:
        request = {"name": "dev", "exactly": {"deviceClassName": device_class}}
    return {"devices": {"requests": [request]}}


def using(name: str, entry: dict[str, str]) -> dict[str, Any]:
    """A pod without schedulerName using one claim (``entry``: resourceClaimName or resourceClaimTemplateName)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 0, "resourceClaims": [{"name": "dev", **entry}],
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"claims": [{"name": "dev"}]}}]}}


@pytest.fixture
def steering_webhook(control_plane: ControlPlane, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
                     namespace: str, tmp_path: Path) -> Iterator[FlaggedExtender]:
    """The extender with --dra-claims --steer-claim-pods serving the pod-scheduler webhook over TLS,
    registered for ``namespace`` only; gpupool's DeviceClass and another driver's installed."""
    ca = issue_ca("e2e-dra-steer-ca")
    server = issue_leaf(ca, "gpupool-extender", server=True, hosts=("127.0.0.1",))
    serving = write_files(tmp_path / "serving", {"tls.crt": server.cert_pem, "tls.key": server.key_pem,
                                                 "ca.crt": ca.cert_pem})
    port = free_port()
    extender = FlaggedExtender(control_plane.kubeconfig, tmp_path / "extender.log", tls=True, extra_args=(
        "--tls-cert-file", str(serving / "tls.crt"), "--tls-private-key-file", str(serving / "tls.key"),
        "--client-ca-file", str(serving / "ca.crt"), "--admission-port", str(port),
        "--dra-claims", "--steer-claim-pods", "-v"))
    resource = client.ResourceV1Api(kube_api_client)
    admission = client.AdmissionregistrationV1Api(kube_api_client)
    value = uuid.uuid4().hex[:8]
    name = f"gpupool-dra-steer-{value}"
    hook_config = webhook_configuration(name, f"https://127.0.0.1:{port}/admission/pod-scheduler", ca.cert_pem,
                                        value)
    (hook,) = hook_config["webhooks"]
    (asks,) = [c for c in hook["matchConditions"] if c["name"] == "asks-for-gpupool-resources"]
    asks["expression"] = f"({asks['expression']}){CLAIM_CONDITION}"
    core_v1.patch_namespace(namespace, {"metadata": {"labels": {SELECTOR_KEY: value}}})
    selector = {"cel": {"expression": f'device.driver == "{OTHER_CLASS}"'}}
    resource.create_device_class({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                  "metadata": {"name": OTHER_CLASS}, "spec": {"selectors": [selector]}})
    resource.create_device_class({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                  "metadata": {"name": ADMIN_CLASS}, "spec": {"selectors": [
                                      {"cel": {"expression": f'device.driver == "{DRIVER}"'}},
                                      {"cel": {"expression": f'device.attributes["{DRIVER}"].model'
                                                             '.startsWith("NVIDIA-A100")'}}]}})
    try:
        with dra_installed(kube_api_client, f"no-node-{value}"):
            extender.start()
            admission.create_mutating_webhook_configuration(hook_config)
            try:
                # the apiserver's webhook informer takes a moment: dry-run a pod of a missing claim
                # (steered, the documented choice) until it is
                wait_for(lambda: core_v1.create_namespaced_pod(namespace, using("probe", {
                    "resourceClaimName": "probe-missing"}), dry_run="All").spec.scheduler_name == GPUPOOL_SCHEDULER,
                         timeout=30, what=f"the webhook to steer a dry-run claim pod ({extender.log_path})")
                yield extender
            finally:
                admission.delete_mutating_webhook_configuration(name)
    finally:
        extender.kill()
        resource.delete_device_class(OTHER_CLASS)
        resource.delete_device_class(ADMIN_CLASS)


def test_only_pods_whose_claims_ask_for_gpupools_class_go_to_gpupools_scheduler(
        steering_webhook: FlaggedExtender, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
        namespace: str) -> None:
    resource = client.ResourceV1Api(kube_api_client)
    for claim, spec in (("gpu-claim", claim_spec(DRIVER)), ("nic-claim", claim_spec(OTHER_CLASS)),
                        ("any-claim", claim_spec("", (OTHER_CLASS, DRIVER))),
                        ("nic-or-fpga", claim_spec("", (OTHER_CLASS, f"fpga-{OTHER_CLASS}"))),
                        ("a100-claim", claim_spec(ADMIN_CLASS))):
        resource.create_namespaced_resource_claim(namespace, {"metadata": {"name": claim}, "spec": spec})

    def scheduler_of(pod: str, entry: dict[str, str]) -> str:
        return str(core_v1.create_namespaced_pod(namespace, using(pod, entry)).spec.scheduler_name)

    def template_then_pod(template: str, spec: dict[str, Any]) -> str:
        """The template and at once its pod, as one `kubectl apply` creates them: the webhook may run
        before the extender's template watch has it (then it reads the template from the API)."""
        resource.create_namespaced_resource_claim_template(namespace, {"metadata": {"name": template},
                                                                       "spec": {"spec": spec}})
        return scheduler_of(f"{template}-pod", {"resourceClaimTemplateName": template})

    log = steering_webhook.log_path
    assert scheduler_of("gpu", {"resourceClaimName": "gpu-claim"}) == GPUPOOL_SCHEDULER, log
    assert scheduler_of("nic", {"resourceClaimName": "nic-claim"}) == DEFAULT_SCHEDULER, log
    assert scheduler_of("any", {"resourceClaimName": "any-claim"}) == GPUPOOL_SCHEDULER, log
    assert scheduler_of("nic-or-fpga", {"resourceClaimName": "nic-or-fpga"}) == DEFAULT_SCHEDULER, log
    assert scheduler_of("a100", {"resourceClaimName": "a100-claim"}) == GPUPOOL_SCHEDULER, log  # an admin's class
    assert template_then_pod("gpu-template", claim_spec(DRIVER)) == GPUPOOL_SCHEDULER, log
    assert template_then_pod("nic-template", claim_spec(OTHER_CLASS)) == DEFAULT_SCHEDULER, log
    assert scheduler_of("missing", {"resourceClaimName": "not-created"}) == GPUPOOL_SCHEDULER, log
    # more pods of the same templates, later: the same answers
    assert scheduler_of("gpu-again", {"resourceClaimTemplateName": "gpu-template"}) == GPUPOOL_SCHEDULER, log
    assert scheduler_of("nic-again", {"resourceClaimTemplateName": "nic-template"}) == DEFAULT_SCHEDULER, log
