"""charts/gpupool installed, upgraded and uninstalled by the real Helm 3 against the real apiserver.

tests/e2e/test_helm_e2e.py goes the whole way with Helm 4 (the webhook's CA, a GPU pod through the
chart's scheduler); tests/deploy/test_helm3_compat.py shows Helm 3 renders the same objects. What is
left to show for Helm 3 is what only a live cluster answers, the way docs/helm.md tells Helm 3 users
to install: the release namespace created first (Helm 3 looks for objects to adopt before it creates
it), ``helm install --take-ownership`` adopting it and creating every object of the manifest and the
CRDs, ``helm upgrade --reuse-values`` changing the DaemonSet, and ``helm uninstall`` leaving nothing
but the CRDs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client

from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.errors import BuildImpossibleError
from gpupool.testenv.helm import HELM_3, ensure_helm
from gpupool.testenv.versions import HELM3
from tests.deploy.helm_render import CHART
from tests.e2e.e2e_support import wait_for
from tests.e2e.helm_support import CRDS, NAMESPACES, RELEASE, SYSTEM, Release, identities, released

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def release3(control_plane: ControlPlane, kube_api_client: client.ApiClient,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """Helm 3 (built first if needed); the release, gpupool's namespaces and the CRDs it installed
    removed after the module whatever happened."""
    try:
        binary = ensure_helm(log=lambda m: print(f"[helm 3] {m}", flush=True), release=HELM_3)
    except BuildImpossibleError as exc:
        pytest.skip(f"Helm 3 cannot be built here: {exc}")
    yield from released(binary, control_plane, kube_api_client, tmp_path_factory.mktemp("helm3"))


def test_helm_3_installs_upgrades_and_uninstalls_the_chart(release3: Release, kube_api_client: client.ApiClient,
                                                           core_v1: client.CoreV1Api) -> None:
    assert release3.ok("version", "--short").startswith(HELM3)
    created = release3.kubectl("create", "namespace", SYSTEM)
    assert created.returncode == 0, created.stderr
    release3.ok("install", RELEASE, str(CHART), "--namespace", SYSTEM, "--take-ownership",
                "--set", "image.tag=e2e-1", "--set", f"scheduler.image.tag={release3.plane.binaries.version}")
    manifest = release3.manifest()
    release3.manifests.append(manifest)
    got = release3.kubectl("get", "-f", "-", "-o", "json", stdin=manifest)
    assert got.returncode == 0, got.stderr
    items = json.loads(got.stdout)["items"]
    assert {(i["kind"], i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in items} == \
        identities(manifest)
    assert core_v1.read_namespace(SYSTEM).metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
    extensions = client.ApiextensionsV1Api(kube_api_client)
    for name in CRDS:
        assert extensions.read_custom_resource_definition(name).metadata.name == name

    release3.ok("upgrade", RELEASE, str(CHART), "--namespace", SYSTEM, "--reuse-values",
                "--set", "nodeAgent.isolation=none")
    release3.manifests.append(release3.manifest())
    daemon_set = client.AppsV1Api(kube_api_client).read_namespaced_daemon_set("gpupool-node-agent", "gpupool-node")
    (container,) = daemon_set.spec.template.spec.containers
    assert "--isolation=none" in container.args and "--exit-on-failed-check" in container.args

    release3.plane.start_controllers(("namespace",))
    try:
        release3.ok("uninstall", RELEASE, "--namespace", SYSTEM)

        def namespaces_gone() -> bool | None:
            return True if not {n.metadata.name for n in core_v1.list_namespace().items} & set(NAMESPACES) else None

        wait_for(namespaces_gone, timeout=120, what="gpupool's namespaces deleted")
    finally:
        release3.plane.stop_controllers()
    for manifest in release3.manifests:
        left = release3.kubectl("get", "--ignore-not-found", "-o", "name", "-f", "-", stdin=manifest)
        assert left.returncode == 0 and left.stdout.strip() == "", left.stdout + left.stderr
    assert RELEASE not in release3.helm("list", "--all-namespaces", "--short").stdout.split()
