"""Tenancy's admin side against the real kube-apiserver: the CRDs installed with the command
docs/tenancy.md gives (run as written, with the testenv's kubectl), ResourceGroup writes judged by
the requester's RBAC through the extender's webhook (SubjectAccessReviews), User subjects of a group
enforced on pod creation, each GpuQuota's status written by the extender, and new DRA claims given
their resource groups' cards as a selector (components/dra-claim-groups).

Requesters are impersonated by the admin's client (``Impersonate-User``), so the apiserver authorizes
them with their own RBAC and sends the webhook their ``userInfo``; the extender asks its
SubjectAccessReviews as the admin, as the deployed one does as its ServiceAccount. The webhooks are
the shipped ones (components/quota-webhook/webhook.yaml), pointed at the extender on 127.0.0.1 with
the test's CA, the pod webhook limited to the test's namespace by a label.
"""

from __future__ import annotations

import base64
import re
import shlex
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
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
from tests.e2e.e2e_support import MakeNode, free_port, wait_crds_gone, wait_for
from tests.e2e.trust_support import FlaggedExtender

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "tenancy.md"
SHIPPED = ROOT / "deploy" / "kustomize" / "components" / "quota-webhook" / "webhook.yaml"
GROUP, VERSION = "gpupool.io", "v1alpha1"
CRD_NAMES = ("resourcegroups.gpupool.io", "gpuquotas.gpupool.io")
NAMES = ResourceNames()


def documented_install_command() -> str:
    """The CRD install command of docs/tenancy.md, as an admin would copy it."""
    found = re.search(r"Install the CRDs once: `([^`]+)`", DOCS.read_text())
    assert found is not None, "docs/tenancy.md no longer says how to install the CRDs"
    return found.group(1)


def kubectl(plane: ControlPlane, command: str) -> subprocess.CompletedProcess[str]:
    """``command`` (starting with ``kubectl``) run from the repository's root on the test cluster."""
    words = shlex.split(command)
    assert words[0] == "kubectl", command
    return subprocess.run([str(plane.binaries.kubectl), "--kubeconfig", str(plane.kubeconfig), *words[1:]],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def _crd_exists(extensions: client.ApiextensionsV1Api, name: str) -> bool:
    try:
        extensions.read_custom_resource_definition(name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


@pytest.fixture(scope="module")
def documented_crds(control_plane: ControlPlane, kube_api_client: client.ApiClient
                    ) -> Iterator[subprocess.CompletedProcess[str]]:
    """The CRDs installed by the documented command; removed (and waited for) after the module."""
    extensions = client.ApiextensionsV1Api(kube_api_client)
    terminating = {c.metadata.name for c in extensions.list_custom_resource_definition().items
                   if c.metadata.name in CRD_NAMES and c.metadata.deletion_timestamp is not None}
    if terminating:  # a module before this one may still be deleting them
        wait_crds_gone(extensions, terminating)
    done = kubectl(control_plane, documented_install_command())
    if done.returncode == 0:
        for name in CRD_NAMES:
            wait_for(lambda n=name: any(c.type == "Established" and c.status == "True" for c in
                                        extensions.read_custom_resource_definition(n).status.conditions or []),
                     timeout=30, what=f"CRD {name} established")
    try:
        yield done
    finally:
        for name in CRD_NAMES:
            if _crd_exists(extensions, name):
                extensions.delete_custom_resource_definition(name)
        wait_crds_gone(extensions, set(CRD_NAMES))


def test_the_documented_crd_install_command_works_as_written(
        documented_crds: subprocess.CompletedProcess[str]) -> None:
    assert documented_crds.returncode == 0, documented_crds.stderr
    for name in CRD_NAMES:
        assert name in documented_crds.stdout


@pytest.fixture(scope="module")
def webhook_extender(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory,
                     kube_api_client: client.ApiClient,
                     documented_crds: subprocess.CompletedProcess[str]) -> Iterator[tuple[FlaggedExtender, str]]:
    """The extender serving the webhooks (trusting the pod-group one), the two tenancy webhooks of the
    shipped configuration registered for it; yields it and the namespace label the pod webhook asks."""
    assert documented_crds.returncode == 0, documented_crds.stderr
    base = tmp_path_factory.mktemp("tenancy-webhooks")
    ca = issue_ca("e2e-tenancy-ca")
    leaf = issue_leaf(ca, "gpupool-extender", server=True, hosts=("127.0.0.1",))
    (base / "tls.crt").write_bytes(leaf.cert_pem)
    (base / "tls.key").write_bytes(leaf.key_pem)
    port = free_port()
    extender = FlaggedExtender(control_plane.kubeconfig, base / "extender.log", tls=True, extra_args=(
        "--tls-cert-file", str(base / "tls.crt"), "--tls-private-key-file", str(base / "tls.key"),
        "--admission-port", str(port), "--creator-subjects-webhook"))
    extender.start()
    label = uuid.uuid4().hex[:8]
    shipped = yaml.safe_load(SHIPPED.read_text())
    hooks = [h for h in shipped["webhooks"] if h["name"] != "pods.quota.gpupool.io"]
    for hook in hooks:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                "caBundle": base64.b64encode(ca.cert_pem).decode()}
        if "namespaceSelector" in hook:
            hook["namespaceSelector"] = {"matchLabels": {"gpupool-e2e-groups": label}}
    name = f"gpupool-tenancy-{label}"
    admission = client.AdmissionregistrationV1Api(kube_api_client)
    admission.create_validating_webhook_configuration({**shipped, "metadata": {"name": name}, "webhooks": hooks})
    try:
        yield extender, label
    finally:
        admission.delete_validating_webhook_configuration(name)
        extender.kill()


@pytest.fixture
def grant(kube_api_client: client.ApiClient) -> Iterator[Callable[..., None]]:
    """``grant(user, rules)``: a ClusterRole of ``rules`` bound to ``user``; deleted after the test."""
    rbac = client.RbacAuthorizationV1Api(kube_api_client)
    made: list[str] = []

    def make(user: str, rules: list[dict[str, Any]]) -> None:
        name = f"tenancy-{uuid.uuid4().hex[:6]}"
        rbac.create_cluster_role({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                  "metadata": {"name": name}, "rules": rules})
        rbac.create_cluster_role_binding({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
        made.append(name)

    yield make
    for name in made:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def as_user(control_plane: ControlPlane, user: str) -> client.ApiClient:
    """A client of the admin's credentials impersonating ``user`` (the apiserver authorizes ``user``)."""
    from kubernetes import config

    api_client = config.new_client_from_config(str(control_plane.kubeconfig))
    api_client.set_default_header("Impersonate-User", user)
    return api_client


def gpu_node(make_node: MakeNode) -> str:
    name = f"ten-{uuid.uuid4().hex[:6]}"
    inventory = Inventory(tuple(GpuCard(i, f"GPU-{name}-{i}", "Tesla-T4", 16_384) for i in range(2)))
    return make_node(name, annotations={NAMES.inventory: encode_inventory(inventory)})


def group_body(name: str, nodes: list[str], subjects: list[dict[str, str]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodes": [{"name": n} for n in nodes]}
    if subjects is not None:
        spec["subjects"] = subjects
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceGroup", "metadata": {"name": name}, "spec": spec}


def refusal(call: Callable[[], Any]) -> str | None:
    """The API's refusal of ``call`` ("<status> <body>"), None when it succeeded."""
    try:
        call()
    except ApiException as exc:
        return f"{exc.status} {exc.body}"
    return None


def until_refused(call: Callable[[], Any], what: str) -> str:
    """The apiserver learns of a new webhook configuration a moment later: retry a dry run until refused."""
    return wait_for(lambda: refusal(call), timeout=30, what=what, interval=0.3)


GROUP_WRITER = [{"apiGroups": [GROUP], "resources": ["resourcegroups"],
                 "verbs": ["get", "list", "create", "update", "patch", "delete"]}]


def test_resourcegroup_writes_are_checked_with_the_requesters_permissions(
        control_plane: ControlPlane, kube_api_client: client.ApiClient, make_node: MakeNode,
        webhook_extender: tuple[FlaggedExtender, str], grant: Callable[..., None]) -> None:
    n1, n2 = gpu_node(make_node), gpu_node(make_node)
    user = f"alice-{uuid.uuid4().hex[:6]}"
    grant(user, [*GROUP_WRITER, {"apiGroups": [""], "resources": ["nodes"], "verbs": ["update"],
                                 "resourceNames": [n1]}])
    alice = client.CustomObjectsApi(as_user(control_plane, user))
    both, mine = f"both-{user}", f"mine-{user}"
    started = time.perf_counter()
    refused = until_refused(lambda: alice.create_cluster_custom_object(
        GROUP, VERSION, "resourcegroups", group_body(both, [n1, n2]), dry_run="All"), "the group webhook refusing")
    print(f"\nfirst refusal after {time.perf_counter() - started:.1f} s (webhook configuration propagating)")
    expected = f"ResourceGroup {both}: {user} may not modify node(s) {n2} (update or patch on nodes)"
    assert refused.startswith("403 ") and 'admission webhook \\"resourcegroups.gpupool.io\\" denied the request: ' \
        + expected in refused, refused
    assert n1 not in refused.split("may not modify")[1]

    started = time.perf_counter()
    alice.create_cluster_custom_object(GROUP, VERSION, "resourcegroups", group_body(mine, [n1]))
    print(f"create of a permitted group through the webhook: {(time.perf_counter() - started) * 1000:.1f} ms")
    try:
        widened = refusal(lambda: alice.patch_cluster_custom_object(
            GROUP, VERSION, "resourcegroups", mine, {"spec": {"nodes": [{"name": n1}, {"name": n2}]}}))
        assert widened is not None and widened.startswith("403 ") and f"node(s) {n2}" in widened
        # the admin (system:masters) may group any node: two nameless reviews answer for every node
        admin = client.CustomObjectsApi(kube_api_client)
        admin.patch_cluster_custom_object(GROUP, VERSION, "resourcegroups", mine,
                                          {"spec": {"nodes": [{"name": n1}, {"name": n2}]}})
        # now the group names n2: alice may neither change nor delete it
        shared = refusal(lambda: alice.patch_cluster_custom_object(GROUP, VERSION, "resourcegroups", mine,
                                                                   {"spec": {"shared": True}}))
        assert shared is not None and f"node(s) {n2}" in shared
        deleted = refusal(lambda: alice.delete_cluster_custom_object(GROUP, VERSION, "resourcegroups", mine))
        assert deleted is not None and f"node(s) {n2}" in deleted
    finally:
        client.CustomObjectsApi(kube_api_client).delete_cluster_custom_object(GROUP, VERSION, "resourcegroups", mine)


def test_a_groups_user_subjects_decide_who_may_create_pods_naming_it(
        control_plane: ControlPlane, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
        namespace: str, make_node: MakeNode, webhook_extender: tuple[FlaggedExtender, str],
        grant: Callable[..., None]) -> None:
    _, label = webhook_extender
    core_v1.patch_namespace(namespace, {"metadata": {"labels": {"gpupool-e2e-groups": label}}})
    node = gpu_node(make_node)
    suffix = uuid.uuid4().hex[:6]
    alice, bob, name = f"alice-{suffix}", f"bob-{suffix}", f"users-{suffix}"
    for user in (alice, bob):
        grant(user, [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}])
    admin = client.CustomObjectsApi(kube_api_client)
    admin.create_cluster_custom_object(GROUP, VERSION, "resourcegroups",
                                       group_body(name, [node], [{"kind": "User", "name": alice}]))
    try:
        def pod(pod_name: str) -> dict[str, Any]:
            return {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod_name, "labels": {"gpupool.io/group": name}},
                    "spec": {"schedulerName": "no-scheduler", "containers": [
                        {"name": "main", "image": "busybox", "resources": {"limits": {NAMES.gpu: "1"}}}]}}

        as_bob = client.CoreV1Api(as_user(control_plane, bob))
        refused = until_refused(lambda: as_bob.create_namespaced_pod(namespace, pod("bobs"), dry_run="All"),
                                "the pod-group webhook refusing")
        assert refused.startswith("403 ") and f"resource group {name} admits neither namespace {namespace} " \
            f"(ServiceAccount default) nor the requester {bob}: its subjects are User {alice}" in refused, refused
        as_alice = client.CoreV1Api(as_user(control_plane, alice))
        assert refusal(lambda: as_alice.create_namespaced_pod(namespace, pod("alices"))) is None
        # setting the label later is judged like a create: the admin is no subject of the group either
        unlabelled = pod("plain")
        unlabelled["metadata"]["labels"] = {}
        core_v1.create_namespaced_pod(namespace, unlabelled)
        relabel = refusal(lambda: core_v1.patch_namespaced_pod(
            "plain", namespace, {"metadata": {"labels": {"gpupool.io/group": name}}}))
        assert relabel is not None and relabel.startswith("403 ") and "admits neither" in relabel
    finally:
        admin.delete_cluster_custom_object(GROUP, VERSION, "resourcegroups", name)


def test_the_extender_writes_each_quotas_used_and_hard_amounts_to_its_status(
        kube_api_client: client.ApiClient, namespace: str, webhook_extender: tuple[FlaggedExtender, str]) -> None:
    custom = client.CustomObjectsApi(kube_api_client)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuQuota", "metadata": {"name": "gpus"},
            "spec": {"hard": {"wholeGpus": 2}, "models": {"Tesla-T4": {"computePercent": 150}}}}
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpuquotas", body)

    def status(expected_hard: int) -> dict[str, Any] | None:
        found = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "gpuquotas", "gpus")
        return found if found.get("status", {}).get("hard", {}).get("wholeGpus") == expected_hard else None

    found = wait_for(lambda: status(2), timeout=30, what="the quota's status written")
    assert found["status"] == {
        "hard": {"wholeGpus": 2}, "used": {"memoryMiB": 0, "computePercent": 0, "wholeGpus": 0},
        "models": {"Tesla-T4": {"hard": {"computePercent": 150},
                                "used": {"memoryMiB": 0, "computePercent": 0, "wholeGpus": 0}}}}
    version = found["metadata"]["resourceVersion"]
    time.sleep(12)  # two writer passes: nothing changed, nothing written
    assert custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "gpuquotas", "gpus")["metadata"][
        "resourceVersion"] == version
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "gpuquotas", "gpus",
                                          {"spec": {"hard": {"wholeGpus": 3}}})
    wait_for(lambda: status(3), timeout=30, what="the changed limit in the status")


CLAIM_GROUPS = ROOT / "deploy" / "kustomize" / "components" / "dra-claim-groups" / "webhook.yaml"


def test_new_claims_get_their_groups_cards_as_a_selector_the_apiserver_accepts(
        kube_api_client: client.ApiClient, core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode,
        webhook_extender: tuple[FlaggedExtender, str]) -> None:
    """The shipped claim-groups webhook (docs/dra.md, "Resource groups and claims"): the selector is
    stored with the claim, so the apiserver compiled its CEL; a group that does not exist refuses the
    claim; without a group the reserved cards are kept out; another driver's claim is left alone."""
    _, label = webhook_extender
    core_v1.patch_namespace(namespace, {"metadata": {"labels": {"gpupool-e2e-groups": label}}})
    node = gpu_node(make_node)
    name = f"claims-{uuid.uuid4().hex[:6]}"
    cards = [f"GPU-{node}-0", f"GPU-{node}-1"]
    shipped = yaml.safe_load(CLAIM_GROUPS.read_text())
    (hook,) = shipped["webhooks"]
    admission = client.AdmissionregistrationV1Api(kube_api_client)
    served = admission.read_validating_webhook_configuration(f"gpupool-tenancy-{label}").webhooks[0].client_config
    base = served.url[:served.url.index("/admission/")]  # the fixture's extender, with the test's CA
    hook["clientConfig"] = {"url": base + hook["clientConfig"]["service"]["path"], "caBundle": served.ca_bundle}
    hook["namespaceSelector"] = {"matchLabels": {"gpupool-e2e-groups": label}}
    admission.create_mutating_webhook_configuration({**shipped, "metadata": {"name": f"gpupool-claims-{label}"}})
    admin = client.CustomObjectsApi(kube_api_client)
    admin.create_cluster_custom_object(GROUP, VERSION, "resourcegroups", group_body(name, [node]))

    def claim(cls: str = "gpu.gpupool.io") -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"generateName": "c-"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}}}

    def create(body: dict[str, Any], dry_run: str | None = "All") -> dict[str, Any]:
        made: dict[str, Any] = admin.create_namespaced_custom_object("resource.k8s.io", "v1", namespace,
                                                                      "resourceclaims", body, dry_run=dry_run)
        return made

    def selectors(made: dict[str, Any]) -> list[str]:
        return [s["cel"]["expression"] for s in made["spec"]["devices"]["requests"][0]["exactly"].get("selectors", [])]

    allow = f'device.attributes["gpu.gpupool.io"].uuid in ["{cards[0]}", "{cards[1]}"]'
    try:
        core_v1.patch_namespace(namespace, {"metadata": {"annotations": {"gpupool.io/default-groups": name}}})
        stored = wait_for(lambda: (lambda m: m if selectors(m) == [allow] else None)(create(claim(), None)),
                          timeout=30, what="a claim stored with its group's selector", interval=0.3)
        assert selectors(stored) == [allow]
        assert selectors(create(claim("nic.example.com"))) == []
        core_v1.patch_namespace(namespace, {"metadata": {"annotations": {"gpupool.io/default-groups": "gone"}}})
        refused = until_refused(lambda: create(claim()), "a claim of a missing group refused")
        assert refused.startswith("403 ") and "gpupool: resource group gone does not exist" in refused, refused
        core_v1.patch_namespace(namespace, {"metadata": {"annotations": {"gpupool.io/default-groups": None}}})
        avoided = wait_for(lambda: (lambda s: s if s and s[0].startswith("!(") else None)(selectors(create(claim()))),
                           timeout=30, what="a claim without a group kept off reserved cards", interval=0.3)
        assert all(f'"{card}"' in " ".join(avoided) for card in cards)
        # the longest list one expression holds (231 UUIDs of NVML's length): the apiserver's CEL cost limit passes it
        listed = cards + [f"GPU-{uuid.UUID(int=i)}" for i in range(229)]
        admin.patch_cluster_custom_object(GROUP, VERSION, "resourcegroups", name,
                                          {"spec": {"nodes": [{"name": node, "gpus": listed}]}})
        core_v1.patch_namespace(namespace, {"metadata": {"annotations": {"gpupool.io/default-groups": name}}})
        longest = wait_for(lambda: (lambda s: s if s and len(s[0]) > 10_000 else None)(
            selectors(create(claim(), None))), timeout=30, what="a claim stored with a 231-card selector", interval=0.3)
        assert longest[0].count('"GPU-') == 231
    finally:
        admin.delete_cluster_custom_object(GROUP, VERSION, "resourcegroups", name)
        admission.delete_mutating_webhook_configuration(f"gpupool-claims-{label}")
