"""charts/gpupool installed, upgraded and uninstalled by the real helm against the real apiserver.

The tests run in file order on one release (``RELEASE`` in the namespace ``gpupool-system``, which
helm creates and the chart then owns, as docs/helm.md tells admins to install it):

1. ``helm install`` creates every object the release's manifest lists (server-side apply), the CRDs
   from the chart's crds/, and no pod-scheduler webhook yet: its caBundle is the bootstrap Job's CA,
   which does not exist before the Job ran.
2. ``helm upgrade --reuse-values`` with a changed value (``nodeAgent.isolation=none``, a new image
   tag) changes the DaemonSet's args and image, and replaces the certificate Job (a Job's pod
   template cannot change).
3. Once the Secret the bootstrap Job writes exists, ``helm upgrade`` reads its CA (Helm's lookup)
   and installs the webhook with that caBundle. Then a GPU pod goes the whole way through the
   chart's objects: created without ``schedulerName``, steered by the chart's webhook, placed and
   bound by the upstream kube-scheduler running the configuration the chart installed, as the
   chart's ServiceAccount, calling a real extender over mutual TLS. What cannot run here is replaced
   and said so: the test environment runs no pods of its own (no image registry, no kube-proxy),
   so the extender and the scheduler run as processes with the installed configuration, its URL
   and certificate paths pointed at them, and the webhook's clientConfig is pointed at the
   extender's address (the apiserver cannot reach a Service without kube-proxy).
4. ``helm uninstall`` leaves nothing behind but the CRDs: every object of the manifest is gone,
   the namespaces too (with the Secrets, Leases and Events made in them at run time; the
   namespace controller runs for this), and so is Helm's release record.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpupool.api.annotations import Inventory, decode_assignment, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard
from gpupool.extender.scheduler_steering import GPUPOOL_SCHEDULER
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.errors import BuildImpossibleError
from gpupool.testenv.helm import ensure_helm
from gpupool.testenv.procs import ManagedProcess
from tests.deploy.helm_render import CHART
from tests.e2e.e2e_support import MakeNode, free_port, gpu_pod_manifest, log_tail, wait_for
from tests.e2e.helm_support import CRDS, NAMESPACES, RELEASE, SYSTEM, Release, identities, released
from tests.e2e.shipped_scheduler import start_shipped_scheduler, write_files
from tests.e2e.test_deploy_e2e import service_account_kubeconfig
from tests.e2e.trust_support import FlaggedExtender

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane, kube_api_client: client.ApiClient,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """helm (built first if needed), with the release uninstalled and gpupool's namespaces removed
    after the module whatever happened."""
    try:
        binary = ensure_helm(log=lambda m: print(f"[helm] {m}", flush=True))
    except BuildImpossibleError as exc:
        pytest.skip(f"helm cannot be built here: {exc}")
    yield from released(binary, control_plane, kube_api_client, tmp_path_factory.mktemp("helm"))


def test_install_creates_every_object_and_the_crds_and_the_webhook_awaiting_its_ca(
        release: Release, kube_api_client: client.ApiClient) -> None:
    release.ok("install", RELEASE, str(CHART), "--namespace", SYSTEM, "--create-namespace", "--take-ownership",
               "--set", "image.tag=e2e-1", "--set", f"scheduler.image.tag={release.plane.binaries.version}")
    manifest = release.manifest()
    release.manifests.append(manifest)
    wanted = identities(manifest)
    got = release.kubectl("get", "-f", "-", "-o", "json", stdin=manifest)
    assert got.returncode == 0, got.stderr
    items = json.loads(got.stdout)["items"]
    assert {(i["kind"], i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in items} == wanted
    for item in items:
        assert item["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", item["metadata"]["name"]
    kinds = {kind for kind, _, _ in wanted}
    assert {"Deployment", "DaemonSet", "ValidatingAdmissionPolicy", "NetworkPolicy", "Job", "CronJob"} <= kinds
    assert "MutatingWebhookConfiguration" in kinds  # installed at once; its CA comes from the Job
    (hook,) = client.AdmissionregistrationV1Api(kube_api_client).read_mutating_webhook_configuration(
        "gpupool-scheduler").webhooks
    assert not hook.client_config.ca_bundle
    core_v1 = client.CoreV1Api(kube_api_client)
    system = core_v1.read_namespace(SYSTEM)
    assert system.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"  # the chart's, taken over
    assert system.metadata.annotations["meta.helm.sh/release-name"] == RELEASE
    crds = client.ApiextensionsV1Api(kube_api_client)
    for name in CRDS:
        assert crds.read_custom_resource_definition(name).metadata.name == name
    status = json.loads(release.ok("status", RELEASE, "--namespace", SYSTEM, "-o", "json"))
    assert status["info"]["status"] == "deployed"


def agent(kube_api_client: client.ApiClient) -> Any:
    return client.AppsV1Api(kube_api_client).read_namespaced_daemon_set("gpupool-node-agent", "gpupool-node")


def jobs(kube_api_client: client.ApiClient) -> list[str]:
    return sorted(j.metadata.name for j in client.BatchV1Api(kube_api_client).list_namespaced_job(SYSTEM).items)


def test_upgrade_with_a_changed_value_takes_effect(release: Release, kube_api_client: client.ApiClient) -> None:
    (container,) = agent(kube_api_client).spec.template.spec.containers
    assert "--isolation=auto" in container.args  # the default: enforce
    (job_before,) = jobs(kube_api_client)
    release.ok("upgrade", RELEASE, str(CHART), "--namespace", SYSTEM, "--reuse-values",
               "--set", "nodeAgent.isolation=none", "--set", "image.tag=e2e-2")
    release.manifests.append(release.manifest())
    (container,) = agent(kube_api_client).spec.template.spec.containers
    assert "--isolation=none" in container.args and "--isolation=auto" not in container.args
    assert container.image == "gpupool:e2e-2"
    (job_after,) = jobs(kube_api_client)  # a new Job for the new image, the old one deleted
    assert job_after != job_before
    history = json.loads(release.ok("history", RELEASE, "--namespace", SYSTEM, "-o", "json"))
    assert [h["revision"] for h in history] == [1, 2]


def test_the_certificate_job_writes_the_webhooks_ca_and_a_gpu_pod_goes_through_the_charts_scheduler(
        release: Release, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api, namespace: str,
        make_node: MakeNode, tmp_path: Path) -> None:
    # the Job's command, as the Job's ServiceAccount (the chart's RBAC must be enough); the serving
    # certificate also names 127.0.0.1, where this test's extender listens
    (job,) = client.BatchV1Api(kube_api_client).list_namespaced_job(SYSTEM).items
    args = list(job.spec.template.spec.containers[0].args)
    certs_kubeconfig = service_account_kubeconfig(release.plane, core_v1, SYSTEM, "gpupool-certs",
                                                  tmp_path / "certs-kubeconfig")
    done = subprocess.run([sys.executable, "-c", "from gpupool.cli.main import main; main()", *args,
                           "--host=127.0.0.1", f"--kubeconfig={certs_kubeconfig}",
                           f"--client-dir={tmp_path / 'client'}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "wrote the CA into mutating/gpupool-scheduler" in done.stdout, done.stdout
    assert "left alone: validating/gpupool-quota" in done.stdout  # the quota webhook is off by default
    tls = core_v1.read_namespaced_secret("gpupool-extender-tls", SYSTEM).data
    files = {k: base64.b64decode(v) for k, v in tls.items()}
    admission = client.AdmissionregistrationV1Api(kube_api_client)
    (hook,) = admission.read_mutating_webhook_configuration("gpupool-scheduler").webhooks
    assert base64.b64decode(hook.client_config.ca_bundle) == files["ca.crt"]
    release.ok("upgrade", RELEASE, str(CHART), "--namespace", SYSTEM, "--reuse-values")  # keeps the CA (lookup)
    release.manifests.append(release.manifest())
    (hook,) = admission.read_mutating_webhook_configuration("gpupool-scheduler").webhooks
    assert base64.b64decode(hook.client_config.ca_bundle) == files["ca.crt"]

    serving_dir = write_files(tmp_path / "serving", files)
    client_dir = tmp_path / "client"
    admission_port = free_port()
    # The chart's ConfigMap requires agent Leases (extender.requireAgentLease); this node has no agent,
    # so the extender here overrides that one setting (as a flag does, with its warning).
    extender = FlaggedExtender(release.plane.kubeconfig, tmp_path / "extender.log", tls=True, extra_args=(
        "--tls-cert-file", str(serving_dir / "tls.crt"), "--tls-private-key-file", str(serving_dir / "tls.key"),
        "--client-ca-file", str(serving_dir / "ca.crt"), "--admission-port", str(admission_port),
        "--no-require-agent-lease"))
    scheduler: ManagedProcess | None = None
    try:
        extender.start()
        installed = core_v1.read_namespaced_config_map("gpupool-scheduler-config", SYSTEM)
        kubeconfig = service_account_kubeconfig(release.plane, core_v1, SYSTEM, "gpupool-scheduler",
                                                tmp_path / "scheduler-kubeconfig")
        scheduler, log = start_shipped_scheduler(
            release.plane.binaries.kube_scheduler, yaml.safe_load(installed.data["config.yaml"]), kubeconfig=kubeconfig,
            workdir=tmp_path, extender_url=extender.url, client_dir=client_dir, what="the chart's kube-scheduler")
        # the one change to the installed webhook: the extender's address instead of its Service
        admission.patch_mutating_webhook_configuration("gpupool-scheduler", [
            {"op": "replace", "path": "/webhooks/0/clientConfig",
             "value": {"url": f"https://127.0.0.1:{admission_port}/admission/pod-scheduler",
                       "caBundle": hook.client_config.ca_bundle}}])
        name = f"helm-{uuid.uuid4().hex[:6]}"
        cards = tuple(GpuCard(i, f"GPU-{name}-{i}", "Tesla-T4", 16_384) for i in range(2))
        node = make_node(name, {"cpu": "16", "memory": "64Gi", "pods": "110"},
                         annotations={NAMES.inventory: encode_inventory(Inventory(cards))})
        body = gpu_pod_manifest("gpu", [("main", {NAMES.gpu_mem: "16"})])
        assert "schedulerName" not in body["spec"]

        def steered() -> str | None:  # the apiserver's webhook informer takes a moment
            pod = core_v1.create_namespaced_pod(namespace, body, dry_run="All")
            return pod.spec.scheduler_name if pod.spec.scheduler_name == GPUPOOL_SCHEDULER else None

        wait_for(steered, timeout=30, what="the chart's webhook to steer a dry-run GPU pod")
        started = time.monotonic()
        assert core_v1.create_namespaced_pod(namespace, body).spec.scheduler_name == GPUPOOL_SCHEDULER
        try:
            where = wait_for(lambda: core_v1.read_namespaced_pod("gpu", namespace).spec.node_name, timeout=60,
                             what="the GPU pod bound")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log_tail(log)}\n{log_tail(extender.log_path)}") from None
        took = time.monotonic() - started
        assert where == node
        pod = core_v1.read_namespaced_pod("gpu", namespace)
        assert decode_assignment(pod.metadata.annotations[NAMES.assignment]).node == node  # the extender's bind
        lease = client.CoordinationV1Api(kube_api_client).read_namespaced_lease("gpupool-scheduler", SYSTEM)
        assert lease.spec.holder_identity  # leader-elected on the chart's Lease, as the chart's account
        print(f"\nGPU pod created without schedulerName, steered by the chart's webhook and bound by its "
              f"scheduler in {took:.1f} s")
    finally:
        if scheduler is not None:
            scheduler.stop()
        extender.kill()


def test_uninstall_leaves_nothing_behind_but_the_crds(release: Release, kube_api_client: client.ApiClient,
                                                       core_v1: client.CoreV1Api) -> None:
    assert release.manifests, "nothing was installed (the install test failed)"
    release.plane.start_controllers(("namespace",))  # deletes a namespace's contents, then the namespace
    try:
        release.ok("uninstall", RELEASE, "--namespace", SYSTEM)

        def namespaces_gone() -> bool | None:
            names = {n.metadata.name for n in core_v1.list_namespace().items}
            return True if not names & set(NAMESPACES) else None

        wait_for(namespaces_gone, timeout=120, what="gpupool's namespaces deleted")
    finally:
        release.plane.stop_controllers()
    for manifest in release.manifests:  # every revision's objects, cluster-scoped ones included
        left = release.kubectl("get", "--ignore-not-found", "-o", "name", "-f", "-", stdin=manifest)
        assert left.returncode == 0 and left.stdout.strip() == "", left.stdout + left.stderr
    assert RELEASE not in release.helm("list", "--all-namespaces", "--short").stdout.split()
    crds = client.ApiextensionsV1Api(kube_api_client)
    for name in CRDS:  # Helm never deletes CRDs (docs/helm.md, "Uninstall")
        assert crds.read_custom_resource_definition(name).metadata.name == name
