"""deploy/ against the real kube-apiserver (v1.37.2, RBAC authorizer on).

What is deployed is the production overlay as ``kubectl kustomize`` renders it
(deploy/kustomize/overlays/production; tests/e2e/test_kustomize_e2e.py sends every overlay through
``kubectl apply --dry-run=server``).

* The RBAC objects of deploy/ are created (namespace rewritten to the test's own) and
  SubjectAccessReview shows each ServiceAccount is allowed exactly the verbs its code uses, over a
  matrix of verbs and resources, so an extra grant fails as surely as a missing one.
* The real clients then run *as* those ServiceAccounts (a TokenRequest token in a kubeconfig):
  the node agent's ``KubePodSource`` publishes a Node's inventory, fills its pod cache by a
  field-selected list+watch, reads a pod through it and by name, and annotates it; an
  extender replica (``start_replica`` with ``_clients``) lists and watches, takes the Lease and binds
  that pod. A permission the code needs but the Role lacks fails here, not in production.
* The Deployments (extender, gpupool's own scheduler), the scheduler's ConfigMap, the DaemonSet and
  the Service are created with server-side dry run, so the apiserver
  validates them, and every field the manifests set must come back: the apiserver drops unknown
  fields (with at most a warning), so a misspelt key would otherwise pass validation and be lost.
"""

from __future__ import annotations

import asyncio
import copy
import json
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, utils
from kubernetes.client.rest import ApiException

from gpupool.api.annotations import decode_allocated, decode_assignment, decode_inventory
from gpupool.api.cluster_settings import CONFIG_MAP_NAME, ClusterSettings
from gpupool.api.names import ResourceNames
from gpupool.cli.extender_cmd import ExtenderOptions, _clients, start_replica
from gpupool.extender.lease import LeaseSettings
from gpupool.kube.client_config import api_configuration
from gpupool.kube.cluster_config import read_cluster_settings
from gpupool.nodeagent.allocated_codec import encode_served
from gpupool.nodeagent.heartbeat import HeartbeatSettings, kube_heartbeat
from gpupool.nodeagent.kube_pod_source import KubePodSource
from gpupool.nodeagent.node_pod import decode_node_pod
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.testenv.config import render_kubeconfig
from gpupool.testenv.controlplane import ControlPlane
from tests.deploy.kustomize_render import render, require_kubectl
from tests.e2e.conftest import delete_namespace
from tests.e2e.e2e_support import NO_SCHEDULER, MakeNode, wait_for

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
#: The extender's and the node agent's namespaces (deploy/kustomize/base/namespaces.yaml): both are
#: moved into the test's namespace, so that the test's objects live and die with it.
DEPLOYED_NAMESPACES = ("gpupool-system", "gpupool-node")
#: The node agents' heartbeat Leases live in a namespace of their own.
DEPLOYED_LEASE_NAMESPACE = "gpupool-node-lease"
AGENT_LEASE = "gpupool-agent-n1"
EXTENDER_SA, AGENT_SA, CERTS_SA = "gpupool-extender", "gpupool-node-agent", "gpupool-certs"
SCHEDULER_SA = "gpupool-scheduler"
LEASE = "gpupool-extender"  # the extender's default --lease-name, as deploy/ runs it
#: The Secrets `gpupool certs bootstrap` makes (components/certs-bootstrap/certs-rbac.yaml).
CERT_SECRETS = ("gpupool-extender-tls", "gpupool-extender-tls-client", "gpupool-extender-tls-ca")
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
#: (group, resource, subresource) probed for every verb.
RESOURCES = (("", "pods", ""), ("", "pods", "binding"), ("", "pods", "status"), ("", "pods", "eviction"),
             ("", "nodes", ""), ("", "nodes", "status"), ("", "secrets", ""), ("", "configmaps", ""),
             ("", "events", ""), ("", "serviceaccounts", "token"), ("coordination.k8s.io", "leases", ""),
             ("apps", "daemonsets", ""), ("", "namespaces", ""), ("gpupool.io", "resourcegroups", ""),
             ("gpupool.io", "gpuquotas", ""), ("gpupool.io", "gpuquotas", "status"))


def lease_namespace(namespace: str) -> str:
    """Where the test deploys what deploy/ puts in the agents' Lease namespace."""
    return f"{namespace}-lease"


def deploy_documents(namespace: str) -> list[dict[str, Any]]:
    """The rendered production overlay with gpupool's namespaces rewritten to ``namespace`` and the
    agents' Lease namespace to :func:`lease_namespace` (objects, ServiceAccount subjects)."""
    require_kubectl()
    docs = []
    moved = {**dict.fromkeys(DEPLOYED_NAMESPACES, namespace), DEPLOYED_LEASE_NAMESPACE: lease_namespace(namespace)}
    for doc in render("overlays/production"):
        if doc["kind"] == "Namespace":
            continue  # the test makes its own
        if doc.get("metadata", {}).get("namespace") in moved:
            doc["metadata"]["namespace"] = moved[doc["metadata"]["namespace"]]
        for subject in doc.get("subjects", []):
            if subject.get("namespace") in moved:
                subject["namespace"] = moved[subject["namespace"]]
        docs.append(doc)
    return docs


def _delete(api_client: client.ApiClient, doc: dict[str, Any]) -> None:
    name, namespace = doc["metadata"]["name"], doc["metadata"].get("namespace")
    rbac = client.RbacAuthorizationV1Api(api_client)
    calls = {"ServiceAccount": lambda: client.CoreV1Api(api_client).delete_namespaced_service_account(name, namespace),
             "ClusterRole": lambda: rbac.delete_cluster_role(name),
             "ClusterRoleBinding": lambda: rbac.delete_cluster_role_binding(name),
             "Role": lambda: rbac.delete_namespaced_role(name, namespace),
             "RoleBinding": lambda: rbac.delete_namespaced_role_binding(name, namespace)}
    try:
        calls[doc["kind"]]()
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def deployed_rbac(kube_api_client: client.ApiClient, namespace: str) -> Iterator[str]:
    """deploy/'s ServiceAccounts, Roles and bindings in the test namespace (and the Lease namespace
    beside it); all deleted after."""
    docs = [d for d in deploy_documents(namespace) if d["kind"] in RBAC_KINDS]
    assert {d["kind"] for d in docs} == set(RBAC_KINDS)
    created: list[dict[str, Any]] = []
    core_v1 = client.CoreV1Api(kube_api_client)
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=lease_namespace(namespace))))
    try:
        for doc in docs:
            utils.create_from_dict(kube_api_client, doc)
            created.append(doc)
        yield namespace
    finally:
        for doc in reversed(created):
            _delete(kube_api_client, doc)
        delete_namespace(core_v1, lease_namespace(namespace))


def allowed(authz: client.AuthorizationV1Api, namespace: str, account: str, attrs: dict[str, str]) -> bool:
    """The apiserver's RBAC decision for the ServiceAccount, with the groups its token carries."""
    review = authz.create_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": f"system:serviceaccount:{namespace}:{account}",
                 "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                            "system:authenticated"],
                 "resourceAttributes": attrs}})
    return bool(review.status.allowed)


def matrix(namespace: str) -> list[dict[str, str]]:
    """Every probed verb on every probed resource: pods in another namespace (ClusterRoles reach
    everywhere), the Lease by its name and by another, in the lease namespace and elsewhere."""
    probes = []
    for group, resource, sub in RESOURCES:
        cluster_scoped = resource in ("nodes", "namespaces", "resourcegroups")
        places: list[tuple[str, str]] = [("", "")] if cluster_scoped else [("default", "")]
        if resource == "leases":
            places = [(namespace, LEASE), (namespace, "someone-else"), (namespace, ""), ("default", LEASE),
                      (lease_namespace(namespace), AGENT_LEASE), (lease_namespace(namespace), "")]
        elif resource == "pods" and sub:
            places = [("default", "p")]
        elif resource == "configmaps":
            places = [(namespace, CONFIG_MAP_NAME), (namespace, "someone-else"), (namespace, ""), ("default", "")]
        elif resource == "secrets":
            places = [(namespace, CERT_SECRETS[0]), (namespace, CERT_SECRETS[2]), (namespace, "someone-else"),
                      (namespace, ""), ("default", CERT_SECRETS[0]), ("default", "")]
        for verb in VERBS:
            for ns, name in places:
                if verb in ("list", "watch", "deletecollection", "create") and name and not sub:
                    continue  # these requests carry no name
                probes.append({"verb": verb, "group": group, "resource": resource, "subresource": sub,
                               "namespace": ns, "name": name})
    return probes


def key(attrs: dict[str, str]) -> tuple[str, ...]:
    return (attrs["verb"], attrs["group"], attrs["resource"], attrs["subresource"], attrs["namespace"],
            attrs["name"])


def expected_extender(namespace: str) -> set[tuple[str, ...]]:
    """What the extender's watch, pod API and lease code call (deploy/kustomize/base/extender-rbac.yaml's header)."""
    return {("list", "", "nodes", "", "", ""), ("watch", "", "nodes", "", "", ""),
            ("get", "", "pods", "", "default", ""), ("list", "", "pods", "", "default", ""),
            ("watch", "", "pods", "", "default", ""), ("patch", "", "pods", "", "default", ""),
            ("create", "", "pods", "binding", "default", "p"), ("create", "", "events", "", "default", ""),
            ("create", "coordination.k8s.io", "leases", "", namespace, ""),
            ("get", "coordination.k8s.io", "leases", "", namespace, LEASE),
            ("update", "coordination.k8s.io", "leases", "", namespace, LEASE),
            ("list", "coordination.k8s.io", "leases", "", lease_namespace(namespace), ""),
            ("watch", "coordination.k8s.io", "leases", "", lease_namespace(namespace), ""),
            ("list", "", "namespaces", "", "", ""), ("watch", "", "namespaces", "", "", ""),
            ("list", "gpupool.io", "resourcegroups", "", "", ""), ("watch", "gpupool.io", "resourcegroups", "", "", ""),
            ("get", "gpupool.io", "resourcegroups", "", "", ""),
            ("list", "gpupool.io", "gpuquotas", "", "default", ""),
            ("watch", "gpupool.io", "gpuquotas", "", "default", ""),
            ("patch", "gpupool.io", "gpuquotas", "status", "default", ""),
            ("get", "", "configmaps", "", namespace, CONFIG_MAP_NAME)}


def expected_node_agent(namespace: str) -> set[tuple[str, ...]]:
    """What gpupool/nodeagent/kube_pod_source.py and heartbeat.py call (deploy/kustomize/base/node-agent-rbac.yaml's
    header): Lease verbs only in the agents' own Lease namespace."""
    leases = lease_namespace(namespace)
    return {("list", "", "pods", "", "default", ""), ("watch", "", "pods", "", "default", ""),
            ("get", "", "pods", "", "default", ""), ("patch", "", "pods", "", "default", ""),
            ("patch", "", "nodes", "", "", ""), ("create", "", "events", "", "default", ""),
            ("get", "", "configmaps", "", namespace, CONFIG_MAP_NAME),
            ("create", "coordination.k8s.io", "leases", "", leases, ""),
            *(("get", "coordination.k8s.io", "leases", "", leases, name) for name in (AGENT_LEASE, "")),
            *(("update", "coordination.k8s.io", "leases", "", leases, name) for name in (AGENT_LEASE, ""))}


def expected_certs(namespace: str) -> set[tuple[str, ...]]:
    """What `gpupool certs bootstrap` calls (gpupool/extender/http/cert_secrets.py): create, and read
    back and replace its own Secrets by name, in the extender's namespace only."""
    return {("create", "", "secrets", "", namespace, ""),
            *((verb, "", "secrets", "", namespace, name) for verb in ("get", "update")
              for name in (CERT_SECRETS[0], CERT_SECRETS[2]))}


def test_service_accounts_are_allowed_exactly_the_verbs_their_code_uses(
    kube_api_client: client.ApiClient, deployed_rbac: str
) -> None:
    authz = client.AuthorizationV1Api(kube_api_client)
    probes = matrix(deployed_rbac)
    for account, expected in ((EXTENDER_SA, expected_extender(deployed_rbac)),
                              (AGENT_SA, expected_node_agent(deployed_rbac)),
                              (CERTS_SA, expected_certs(deployed_rbac))):
        granted = {key(p) for p in probes if allowed(authz, deployed_rbac, account, p)}
        assert granted == expected, (account, "extra:", granted - expected, "missing:", expected - granted)
    # the denials the brief names, spelled out
    for account in (EXTENDER_SA, AGENT_SA, CERTS_SA):
        assert not allowed(authz, deployed_rbac, account, {"verb": "delete", "resource": "pods",
                                                           "namespace": "default"})
        assert not allowed(authz, deployed_rbac, account, {"verb": "update", "resource": "secrets",
                                                           "namespace": deployed_rbac})


def test_gpupools_scheduler_has_the_upstream_roles_and_only_its_own_lease_beyond_them(
    kube_api_client: client.ApiClient, deployed_rbac: str
) -> None:
    """base/scheduler-rbac.yaml: system:kube-scheduler and system:volume-scheduler (the matrix above
    does not apply: those roles are upstream's), plus get/update of the Lease gpupool-scheduler;
    tests/e2e/test_own_scheduler_e2e.py runs the real kube-scheduler as this account."""
    authz = client.AuthorizationV1Api(kube_api_client)
    namespace = deployed_rbac

    def may(verb: str, resource: str, ns: str = "", name: str = "", group: str = "", sub: str = "") -> bool:
        return allowed(authz, namespace, SCHEDULER_SA, {"verb": verb, "group": group, "resource": resource,
                                                         "subresource": sub, "namespace": ns, "name": name})

    leases = "coordination.k8s.io"
    assert may("get", "leases", namespace, SCHEDULER_SA, leases) and may("update", "leases", namespace, SCHEDULER_SA,
                                                                         leases)
    assert may("create", "leases", namespace, group=leases)  # upstream's create, cluster-wide
    assert not may("update", "leases", namespace, LEASE, leases)  # never the extender's Lease
    assert not may("update", "leases", lease_namespace(namespace), AGENT_LEASE, leases)  # nor an agent's
    assert not may("update", "leases", "default", SCHEDULER_SA, leases)  # its own name, elsewhere: no
    assert may("create", "pods", "default", "p", sub="binding") and may("list", "nodes")
    assert may("list", "persistentvolumes")  # system:volume-scheduler
    assert not may("get", "secrets", namespace, CERT_SECRETS[1]) and not may("patch", "nodes")


# ------------------------------------------------------------------------------ as the accounts


def service_account_kubeconfig(control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
                               account: str, path: Path) -> Path:
    """A kubeconfig holding a short-lived token of the ServiceAccount (TokenRequest), as the
    pod's projected token would be."""
    request = core_v1.create_namespaced_service_account_token(
        account, namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)))
    path.write_text(render_kubeconfig(control_plane.server, request.status.token, control_plane.ca_cert.read_bytes()))
    return path


def gpu_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": NO_SCHEDULER, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {NAMES.gpu_mem: "16", NAMES.gpu_core: "30"}}}]}}


def test_the_real_clients_work_as_their_service_accounts(
    control_plane: ControlPlane, core_v1: client.CoreV1Api, deployed_rbac: str, make_node: MakeNode,
    tmp_path: Path,
) -> None:
    namespace = deployed_rbac
    node = make_node(f"deploy-{uuid.uuid4().hex[:6]}")
    core_v1.create_namespaced_pod(namespace, gpu_pod("p1"))
    backend = FakeGpuBackend.from_dict({"model": "Tesla-T4", "cards": [
        {"uuid": f"GPU-{node}-{i}", "memoryMiB": 15360} for i in range(2)]})

    # The node agent: KubePodSource loads its kubeconfig as the agent does (its own client, not the
    # process-wide default, which the other clients of this test keep using).
    saved_default = client.Configuration.get_default_copy()
    agent_config = service_account_kubeconfig(control_plane, core_v1, namespace, AGENT_SA, tmp_path / "agent")
    source = KubePodSource(NAMES, node, str(agent_config))
    asyncio.run(source.publish_node(node, backend.inventory()))
    assert client.Configuration.get_default_copy().host == saved_default.host
    agent_api = client.CoreV1Api(client.ApiClient(api_configuration(str(agent_config))))
    with pytest.raises(ApiException) as denied:
        agent_api.list_node()  # the agent patches its Node; it never lists nodes
    assert denied.value.status == 403
    # its heartbeat: create, then renew, the node's Lease in the agents' Lease namespace
    heartbeat = kube_heartbeat(node, str(agent_config), HeartbeatSettings(lease_namespace(namespace)))
    heartbeat.renew_once()
    heartbeat.renew_once()
    leases = client.CoordinationV1Api(core_v1.api_client)
    beat = leases.read_namespaced_lease(heartbeat.name, lease_namespace(namespace))
    assert beat.spec.holder_identity == node
    published = core_v1.read_node(node).metadata
    assert len(decode_inventory(published.annotations[NAMES.inventory]).cards) == 2
    assert published.labels[NAMES.model_label] == "Tesla-T4"
    # the shared settings: the agent may read the cluster's ConfigMap by its name (none is deployed
    # here: 404, the defaults; without the Role the answer would be 403, "not allowed")
    agent_core = client.CoreV1Api(client.ApiClient(api_configuration(str(agent_config))))
    assert read_cluster_settings(agent_core, f"{namespace}/{CONFIG_MAP_NAME}").note.startswith("no ConfigMap")

    # The extender: its own wiring (_clients, start_replica) on a kubeconfig with its token.
    extender_core, coordination = _clients(str(service_account_kubeconfig(
        control_plane, core_v1, namespace, EXTENDER_SA, tmp_path / "extender")))
    replica = start_replica(ExtenderOptions(policy="binpack", lease_namespace=namespace, identity="deploy-e2e",
                                            cluster=ClusterSettings(agent_lease_namespace=lease_namespace(namespace))),
                            extender_core, coordination,
                            LeaseSettings(lease_duration=3.0, renew_deadline=2.0, retry_period=0.5))
    try:
        assert replica.elector is not None
        wait_for(lambda: replica.cache.synced and replica.elector is not None and replica.elector.is_leader(),
                 timeout=30, what="the extender (as its ServiceAccount) to sync and lead")
        # it lists and watches the agents' Leases: the node's heartbeat is known, nothing refused
        assert replica.liveness is not None
        wait_for(lambda: replica.liveness is not None and replica.liveness.synced, timeout=30,
                 what="the extender's watch of the agent Leases (as its ServiceAccount)")
        assert replica.liveness.refusals(replica.cache.state) == {}
        uid = core_v1.read_namespaced_pod("p1", namespace).metadata.uid
        deadline = time.monotonic() + 30
        while not (result := replica.service.bind(namespace, "p1", uid, node)).ok:
            assert time.monotonic() < deadline, result.error
            time.sleep(0.1)
        with pytest.raises(ApiException) as denied:
            extender_core.delete_namespaced_pod("p1", namespace)
        assert denied.value.status == 403
        # a booking problem becomes an Event on the pod, written with the extender's own pod API
        assert replica.housekeeping.events is not None
        replica.housekeeping.events.create_pod_event(namespace, "p1", uid, "GpupoolDeployCheck", "events work")
        [event] = [e for e in core_v1.list_namespaced_event(namespace).items if e.reason == "GpupoolDeployCheck"]
        assert (event.involved_object.name, event.involved_object.uid, event.type) == ("p1", uid, "Warning")
        # the Lease was created; now it must also be renewed (read + replace), or leadership lapses
        leases = client.CoordinationV1Api(core_v1.api_client)
        created = leases.read_namespaced_lease(LEASE, namespace).metadata.resource_version
        renewed = wait_for(lambda: (lease := leases.read_namespaced_lease(LEASE, namespace))
                           .metadata.resource_version != created and lease, timeout=10, what="a Lease renewal")
        assert renewed.spec.holder_identity == "deploy-e2e" and replica.elector.is_leader()
    finally:
        replica.shutdown()
    bound = core_v1.read_namespaced_pod("p1", namespace)
    assert bound.spec.node_name == node
    assert decode_assignment(bound.metadata.annotations[NAMES.assignment]).node == node

    # The node agent again: its pod cache lists and watches its node's pods, the last-resort read
    # by name works, and it writes allocated-v1 on the pod.
    source = KubePodSource(NAMES, node, str(agent_config))

    async def agent_reads() -> None:
        watching = asyncio.create_task(source.run())
        try:
            assert await source.cache.wait_synced(30), "the pod cache did not sync as the ServiceAccount"
            view = await source.get(namespace, "p1")
            assert view is not None and view.node == node and view.assignment is not None
            assert source.cache.stats.hits == 1 and source.cache.stats.fallback_reads == 0
            raw = await source.read(namespace, "p1")  # the last-resort GET: the pod's JSON, as the watch has it
            decoded = decode_node_pod(raw, NAMES) if raw is not None else None
            assert decoded is not None and decoded.view == view
            await source.annotate(namespace, "p1", {NAMES.allocated: encode_served(node, datetime.now(UTC), [])})
        finally:
            watching.cancel()

    asyncio.run(agent_reads())
    written = core_v1.read_namespaced_pod("p1", namespace).metadata.annotations[NAMES.allocated]
    assert decode_allocated(written).node == node


# ------------------------------------------------------------------------------ schema (dry run)


def lost_fields(sent: Any, returned: Any, path: str = "") -> list[str]:
    """Paths the manifest sets that are absent or different in the server's answer (defaults the
    server adds are fine; anything it dropped is a misspelt or misplaced field)."""
    if isinstance(sent, dict):
        if not isinstance(returned, dict):
            return [path or "/"]
        return [lost for k, v in sent.items()
                for lost in ([f"{path}.{k}"] if k not in returned else lost_fields(v, returned[k], f"{path}.{k}"))]
    if isinstance(sent, list):
        if not isinstance(returned, list) or len(returned) != len(sent):
            return [path]
        return [lost for i, (s, r) in enumerate(zip(sent, returned, strict=True))
                for lost in lost_fields(s, r, f"{path}[{i}]")]
    return [] if sent == returned else [f"{path}: {sent!r} became {returned!r}"]


#: Where each workload kind is POSTed.
COLLECTIONS = {"Deployment": "/apis/apps/v1/namespaces/{}/deployments",
               "DaemonSet": "/apis/apps/v1/namespaces/{}/daemonsets",
               "Service": "/api/v1/namespaces/{}/services",
               "ConfigMap": "/api/v1/namespaces/{}/configmaps"}


def dry_run_create(control_plane: ControlPlane, doc: dict[str, Any]) -> dict[str, Any]:
    """POST the manifest as it is with ``dryRun=All``; the server's answer as raw JSON.

    Plain HTTP rather than the client's typed calls: the client validates bodies against its own
    models (and its models drop unknown fields), which would hide what the apiserver does with
    them. Raises ``HTTPError`` on a refusal.
    """
    url = control_plane.server + COLLECTIONS[doc["kind"]].format(doc["metadata"]["namespace"]) + "?dryRun=All"
    request = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST", headers={
        "Authorization": f"Bearer {control_plane.token}", "Content-Type": "application/json"})
    context = ssl.create_default_context(cafile=str(control_plane.ca_cert))
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def test_workloads_pass_server_side_validation_without_losing_fields(
    control_plane: ControlPlane, kube_api_client: client.ApiClient, namespace: str
) -> None:
    docs = [d for d in deploy_documents(namespace) if d["kind"] in COLLECTIONS]
    # the extender (its Services: the leader's verbs, every replica's webhooks) and gpupool's own
    # scheduler (with its configuration), the node agent, the shared settings
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "ConfigMap", "DaemonSet", "Deployment", "Deployment",
                                               "Service", "Service"]
    for doc in docs:
        answer = dry_run_create(control_plane, doc)
        assert answer["kind"] == doc["kind"] and answer["metadata"]["namespace"] == namespace
        assert lost_fields(doc, answer) == [], doc["kind"]
    apps = client.AppsV1Api(kube_api_client)
    assert apps.list_namespaced_deployment(namespace).items == []  # dry run: nothing was stored
    assert apps.list_namespaced_daemon_set(namespace).items == []

    # The check itself: a misspelt field is dropped by the apiserver without an error, and reported here.
    broken = copy.deepcopy(next(d for d in docs if d["kind"] == "DaemonSet"))
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = [{"name": "tmp", "mountPath": "/x"}]
    answer = dry_run_create(control_plane, broken)
    assert lost_fields(broken, answer) == [".spec.template.spec.containers[0].volumeMount"]
    # and a value the schema refuses is an error, not a silent drop
    invalid = copy.deepcopy(broken)
    invalid["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"] = {"drop": "ALL"}
    with pytest.raises(urllib.error.HTTPError) as refused:
        dry_run_create(control_plane, invalid)
    assert refused.value.code in (400, 422)
