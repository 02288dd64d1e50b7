"""gpupool's own scheduler on the current control plane: a second kube-scheduler with the shipped
profile, and the pod-scheduler webhook steering GPU pods to it; the default scheduler untouched.

What runs, beside the control plane's own kube-scheduler (``default-scheduler``, no extender):

* ``gpupool extender`` with mutual TLS on its verbs and the admission port (a CA of the test, a
  serving certificate for 127.0.0.1, a client certificate for the scheduler);
* the testenv's kube-scheduler binary with the KubeSchedulerConfiguration of
  deploy/kustomize/base/scheduler-config.yaml as ``kubectl kustomize`` renders it, only the
  connection details replaced (the extender's URL and the client certificate files, the Lease's
  namespace), running *as the ServiceAccount* of base/scheduler-rbac.yaml (its RBAC objects
  created, a TokenRequest token) and with the Deployment's ``--authentication-skip-lookup``;
  it must take its Lease to schedule at all;
* components/scheduler-webhook/webhook.yaml registered as shipped (failurePolicy, matchConditions,
  the opt-out namespaceSelector), only ``clientConfig`` pointed at the extender with the test CA
  and the namespaceSelector narrowed to this module's namespaces by one more expression.

Then: a GPU pod created without ``schedulerName`` gets ``gpupool-scheduler`` and is bound by that
scheduler through the extender (assignment annotation, the Scheduled event's reporter); a CPU pod
keeps ``default-scheduler`` and is bound by it; a GPU pod in a namespace labelled
``gpupool.io/scheduler=default``, one annotated so, and one naming another scheduler keep theirs;
with the webhook pointed at an extender that is down, GPU pods are refused with the webhook's name
and CPU pods are created as ever.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils
from kubernetes.client.rest import ApiException

from gpupool.api.annotations import Inventory, decode_assignment, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard
from gpupool.extender.http.certificates import issue_ca, issue_leaf
from gpupool.extender.scheduler_steering import DEFAULT_SCHEDULER, GPUPOOL_SCHEDULER
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.procs import ManagedProcess
from tests.deploy.kustomize_render import KUSTOMIZE, render, require_kubectl
from tests.deploy.test_own_scheduler_deploy import scheduler_config
from tests.e2e.conftest import delete_namespace
from tests.e2e.e2e_support import MakeNode, free_port, gpu_pod_manifest, log_tail, pod_manifest, wait_for
from tests.e2e.shipped_scheduler import start_shipped_scheduler, write_files
from tests.e2e.test_deploy_e2e import service_account_kubeconfig
from tests.e2e.trust_support import FlaggedExtender

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
WEBHOOK = KUSTOMIZE / "components" / "scheduler-webhook" / "webhook.yaml"
SCHEDULER_RBAC = ("ServiceAccount", "ClusterRoleBinding", "Role", "RoleBinding")
SELECTOR_KEY = "gpupool-e2e-own-scheduler"
OPT_OUT = {"gpupool.io/scheduler": "default"}


@dataclass
class OwnScheduler:
    """What the module runs: the extender, gpupool's scheduler, and the namespace of its Lease."""

    extender: FlaggedExtender
    scheduler: ManagedProcess
    log: Path
    lease_namespace: str
    ca_pem: bytes
    run_id: str


def scheduler_rbac(namespace: str, run_id: str) -> list[dict[str, Any]]:
    """base/scheduler-rbac.yaml's objects moved from gpupool-system to ``namespace``; the
    ClusterRoleBindings renamed for this run (they are cluster-wide)."""
    docs = []
    for doc in render("base"):
        if doc["kind"] not in SCHEDULER_RBAC or "gpupool-scheduler" not in doc["metadata"]["name"]:
            continue
        if doc["metadata"].get("namespace") == "gpupool-system":
            doc["metadata"]["namespace"] = namespace
        if doc["kind"] == "ClusterRoleBinding":
            doc["metadata"]["name"] += f"-{run_id}"
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
        docs.append(doc)
    assert sorted(d["kind"] for d in docs) == ["ClusterRoleBinding", "ClusterRoleBinding", "Role", "RoleBinding",
                                               "ServiceAccount"]
    return docs


def delete_rbac(api_client: client.ApiClient, docs: list[dict[str, Any]]) -> None:
    rbac = client.RbacAuthorizationV1Api(api_client)
    for doc in docs:
        if doc["kind"] == "ClusterRoleBinding":
            try:
                rbac.delete_cluster_role_binding(doc["metadata"]["name"])
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture(scope="module")
def own_scheduler(control_plane: ControlPlane, kube_api_client: client.ApiClient,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnScheduler]:
    require_kubectl()
    base = tmp_path_factory.mktemp("own-scheduler")
    run_id = uuid.uuid4().hex[:6]
    core_v1 = client.CoreV1Api(kube_api_client)
    lease_namespace = f"gpupool-sched-{run_id}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=lease_namespace)))
    rbac = scheduler_rbac(lease_namespace, run_id)
    ca = issue_ca("e2e-own-scheduler-ca")
    server = issue_leaf(ca, "gpupool-extender", server=True, hosts=("127.0.0.1",))
    scheduler_client = issue_leaf(ca, "kube-scheduler", server=False)
    serving = write_files(base / "serving",
                          {"tls.crt": server.cert_pem, "tls.key": server.key_pem, "ca.crt": ca.cert_pem})
    client_dir = write_files(base / "client", {"client.crt": scheduler_client.cert_pem,
                                               "client.key": scheduler_client.key_pem, "ca.crt": ca.cert_pem})
    admission_port = free_port()
    extender = FlaggedExtender(control_plane.kubeconfig, base / "extender.log", tls=True, extra_args=(
        "--tls-cert-file", str(serving / "tls.crt"), "--tls-private-key-file", str(serving / "tls.key"),
        "--client-ca-file", str(serving / "ca.crt"), "--admission-port", str(admission_port)))
    extender.admission_port = admission_port  # type: ignore[attr-defined]
    process = None
    try:
        for doc in rbac:
            utils.create_from_dict(kube_api_client, doc)
        extender.start()
        kubeconfig = service_account_kubeconfig(control_plane, core_v1, lease_namespace, "gpupool-scheduler",
                                                base / "scheduler-kubeconfig")
        process, log = start_shipped_scheduler(control_plane.binaries.kube_scheduler, scheduler_config(render("base")),
                                               kubeconfig=kubeconfig, workdir=base, extender_url=extender.url,
                                               client_dir=client_dir, what="gpupool's kube-scheduler",
                                               lease_namespace=lease_namespace)
        leases = client.CoordinationV1Api(kube_api_client)

        def holder() -> str | None:
            try:
                return leases.read_namespaced_lease(GPUPOOL_SCHEDULER, lease_namespace).spec.holder_identity or None
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        wait_for(holder, timeout=30, what=f"gpupool's scheduler to take its Lease\n{log_tail(log)}")
        yield OwnScheduler(extender, process, log, lease_namespace, ca.cert_pem, run_id)
    finally:
        if process is not None:
            process.stop()
        extender.kill()
        delete_rbac(kube_api_client, rbac)
        delete_namespace(core_v1, lease_namespace)


def webhook_configuration(name: str, url: str, ca_pem: bytes, selector_value: str) -> dict[str, Any]:
    """The shipped configuration pointed at ``url`` and, beyond its own namespaceSelector, limited to
    namespaces labelled ``SELECTOR_KEY=selector_value``."""
    shipped: dict[str, Any] = yaml.safe_load(WEBHOOK.read_text())
    shipped["metadata"] = {"name": name}
    (hook,) = shipped["webhooks"]
    hook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca_pem).decode()}
    hook["namespaceSelector"]["matchExpressions"].append(
        {"key": SELECTOR_KEY, "operator": "In", "values": [selector_value]})
    return shipped


@pytest.fixture
def registered(own_scheduler: OwnScheduler, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
               namespace: str) -> Iterator[str]:
    """The webhook, calling the extender, for ``namespace`` (and namespaces labelled like it); yields
    the selector's value."""
    value = uuid.uuid4().hex[:8]
    core_v1.patch_namespace(namespace, {"metadata": {"labels": {SELECTOR_KEY: value}}})
    admission = client.AdmissionregistrationV1Api(kube_api_client)
    name = f"gpupool-scheduler-{value}"
    port = own_scheduler.extender.admission_port  # type: ignore[attr-defined]
    admission.create_mutating_webhook_configuration(webhook_configuration(
        name, f"https://127.0.0.1:{port}/admission/pod-scheduler", own_scheduler.ca_pem, value))
    try:
        # the apiserver's webhook informer takes a moment: dry-run a GPU pod until it is steered
        wait_for(lambda: scheduler_of(create(core_v1, namespace, gpu_pod("probe"), dry_run=True))
                 == GPUPOOL_SCHEDULER, timeout=30, what="the webhook to steer a dry-run GPU pod")
        yield value
    finally:
        admission.delete_mutating_webhook_configuration(name)


def gpu_pod(name: str, **kwargs: Any) -> dict[str, Any]:
    return gpu_pod_manifest(name, [("main", {NAMES.gpu_mem: "16"})], **kwargs)


def create(core_v1: client.CoreV1Api, namespace: str, body: dict[str, Any], dry_run: bool = False) -> Any:
    return core_v1.create_namespaced_pod(namespace, body, dry_run="All" if dry_run else None)


def scheduler_of(pod: Any) -> str:
    return str(pod.spec.scheduler_name)


def gpu_node(make_node: MakeNode) -> str:
    name = f"own-{uuid.uuid4().hex[:6]}"
    cards = tuple(GpuCard(i, f"GPU-{name}-{i}", "Tesla-T4", 16_384) for i in range(2))
    return make_node(name, {"cpu": "16", "memory": "64Gi", "pods": "110"},
                     annotations={NAMES.inventory: encode_inventory(Inventory(cards))})


def bound(core_v1: client.CoreV1Api, namespace: str, name: str) -> str | None:
    node = core_v1.read_namespaced_pod(name, namespace).spec.node_name
    return str(node) if node else None


def scheduled_by(core_v1: client.CoreV1Api, namespace: str, name: str) -> str | None:
    """The reporter of the pod's Scheduled event: the profile's schedulerName."""
    for event in core_v1.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items:
        if event.reason == "Scheduled":
            return str(event.reporting_component or (event.source.component if event.source else ""))
    return None


def test_a_gpu_pod_without_scheduler_name_is_placed_by_gpupools_scheduler_and_a_cpu_pod_by_the_default(
        own_scheduler: OwnScheduler, registered: str, core_v1: client.CoreV1Api, namespace: str,
        make_node: MakeNode) -> None:
    node = gpu_node(make_node)
    body = gpu_pod("gpu")
    assert "schedulerName" not in body["spec"]
    started = time.monotonic()
    assert scheduler_of(create(core_v1, namespace, body)) == GPUPOOL_SCHEDULER
    try:
        where = wait_for(lambda: bound(core_v1, namespace, "gpu"), timeout=60, what="the GPU pod bound")
    except AssertionError as exc:
        logs = f"{log_tail(own_scheduler.log)}\n{log_tail(own_scheduler.extender.log_path)}"
        raise AssertionError(f"{exc}\n{logs}") from None
    took = time.monotonic() - started
    assert where == node
    pod = core_v1.read_namespaced_pod("gpu", namespace)
    assert decode_assignment(pod.metadata.annotations[NAMES.assignment]).node == node  # the extender's bind
    assert wait_for(lambda: scheduled_by(core_v1, namespace, "gpu"), timeout=10,
                    what="the GPU pod's Scheduled event") == GPUPOOL_SCHEDULER

    cpu = pod_manifest("cpu")
    assert scheduler_of(create(core_v1, namespace, cpu)) == DEFAULT_SCHEDULER
    assert wait_for(lambda: bound(core_v1, namespace, "cpu"), timeout=60, what="the CPU pod bound")
    assert wait_for(lambda: scheduled_by(core_v1, namespace, "cpu"), timeout=10,
                    what="the CPU pod's Scheduled event") == DEFAULT_SCHEDULER
    assert NAMES.assignment not in (core_v1.read_namespaced_pod("cpu", namespace).metadata.annotations or {})
    print(f"\nGPU pod created without schedulerName, steered and bound by gpupool-scheduler in {took:.1f} s")


def test_opted_out_and_explicitly_scheduled_pods_keep_their_scheduler(
        registered: str, core_v1: client.CoreV1Api, namespace: str) -> None:
    opted_out_namespace = f"e2e-opt-out-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=opted_out_namespace, labels={SELECTOR_KEY: registered, **OPT_OUT})))
    try:
        assert scheduler_of(create(core_v1, opted_out_namespace, gpu_pod("in-opted-out"))) == DEFAULT_SCHEDULER
        annotated = gpu_pod("annotated")
        annotated["metadata"]["annotations"] = dict(OPT_OUT)
        assert scheduler_of(create(core_v1, namespace, annotated)) == DEFAULT_SCHEDULER
        assert scheduler_of(create(core_v1, namespace, gpu_pod("elsewhere", scheduler_name="someone-else"))) \
            == "someone-else"
        # a sidecar's request counts as the app containers' do (the shipped matchConditions read both)
        sidecar = pod_manifest("sidecar")
        sidecar["spec"]["initContainers"] = [{"name": "side", "image": "busybox:1.36", "restartPolicy": "Always",
                                              "resources": {"limits": {NAMES.gpu_core: "30"}}}]
        assert scheduler_of(create(core_v1, namespace, sidecar, dry_run=True)) == GPUPOOL_SCHEDULER
    finally:
        delete_namespace(core_v1, opted_out_namespace)


def test_while_no_extender_answers_gpu_pods_are_refused_and_cpu_pods_created(
        own_scheduler: OwnScheduler, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
        namespace: str) -> None:
    """failurePolicy Fail, narrowed by the shipped matchConditions to GPU pods (docs/deploy.md)."""
    value = uuid.uuid4().hex[:8]
    core_v1.patch_namespace(namespace, {"metadata": {"labels": {SELECTOR_KEY: value}}})
    admission = client.AdmissionregistrationV1Api(kube_api_client)
    name = f"gpupool-scheduler-down-{value}"
    admission.create_mutating_webhook_configuration(webhook_configuration(
        name, f"https://127.0.0.1:{free_port()}/admission/pod-scheduler", own_scheduler.ca_pem, value))
    try:
        def refusal() -> str | None:
            try:
                create(core_v1, namespace, gpu_pod("refused"), dry_run=True)
            except ApiException as exc:
                return f"{exc.status} {exc.body}"
            return None

        refused = wait_for(refusal, timeout=30, what="the webhook (extender down) to refuse a GPU pod")
        assert 'failed calling webhook \\"pods.scheduler.gpupool.io\\"' in refused, refused
        cpu = pod_manifest("cpu-while-down")
        assert scheduler_of(create(core_v1, namespace, cpu)) == DEFAULT_SCHEDULER
        other = gpu_pod("other-scheduler", scheduler_name="someone-else")
        assert scheduler_of(create(core_v1, namespace, other)) == "someone-else"  # not asked either
    finally:
        admission.delete_mutating_webhook_configuration(name)


def server_dry_run(plane: ControlPlane, namespace: str, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``kubectl create --dry-run=server`` of ``body``: the apiserver runs the webhooks and answers
    the pod as it would store it (stdout, JSON) and the webhooks' warnings (stderr), as users see them."""
    return subprocess.run([str(plane.binaries.kubectl), "--kubeconfig", str(plane.kubeconfig), "-n", namespace,
                           "create", "--dry-run=server", "-o", "json", "-f", "-"],
                          input=json.dumps(body), capture_output=True, text=True, timeout=60, check=False)


def test_memory_sizes_become_counts_and_pods_no_card_holds_are_refused(
        control_plane: ControlPlane, registered: str, core_v1: client.CoreV1Api, namespace: str,
        make_node: MakeNode) -> None:
    """What the apiserver hands the webhook is what the rewrite assumes: a size keeps its binary
    suffix (``4096Mi`` arrives as ``4Gi``), the count comes back in limits and requests with the
    warning kubectl prints; a count in the wrong unit and a card no node has are refused with the
    reason in kubectl's error."""
    gpu_node(make_node)  # 16 GiB cards: the extender's cache then has cards to judge against

    def refusal(limits: dict[str, str]) -> str:
        done = server_dry_run(control_plane, namespace, gpu_pod_manifest("p", [("main", limits)]))
        assert done.returncode != 0, done.stdout
        return done.stderr

    huge = wait_for(lambda: (lambda text: text if "can never be placed" in text else None)(
        refusal({NAMES.gpu_mem: "512Gi"})), timeout=30, what="the extender's cache to know a GPU node")
    assert 'admission webhook "pods.scheduler.gpupool.io" denied the request' in huge
    assert "container main asks for 524288 MiB on one card; the largest card has" in huge
    assert "gpupool.io/gpu-mem counts 256 MiB units: 4096 is 1 TiB; for 4 GiB write 16" in refusal(
        {NAMES.gpu_mem: "4096"})
    assert "GPU compute is a percentage of one card (1..100), got 150" in refusal({NAMES.gpu_core: "150"})
    # the apiserver hands a count of 1000 over as "1k": still the count, never 1000 bytes rounded up to 1
    assert "container main asks for 256000 MiB on one card" in refusal({NAMES.gpu_mem: "1000"})

    for written, count in (("4Gi", "16"), ("4096Mi", "16"), ("1000Mi", "4")):
        body = gpu_pod_manifest("sized", [("main", {NAMES.gpu_mem: written, NAMES.gpu_core: "30"})])
        done = server_dry_run(control_plane, namespace, body)
        assert done.returncode == 0, done.stderr
        stored = json.loads(done.stdout)
        resources = stored["spec"]["containers"][0]["resources"]
        assert resources["limits"][NAMES.gpu_mem] == resources["requests"][NAMES.gpu_mem] == count, written
        assert stored["spec"]["schedulerName"] == GPUPOOL_SCHEDULER
        assert "Warning: gpupool: container main: gpupool.io/gpu-mem counts 256 MiB units: " in done.stderr
        assert f" rewritten as {count} " in done.stderr, done.stderr
