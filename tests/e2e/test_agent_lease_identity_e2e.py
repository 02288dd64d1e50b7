"""A node agent renews only its own node's heartbeat Lease (deploy/kustomize/base/node-agent-lease-policy.yaml).

All agents share one ServiceAccount and RBAC grants it update on every Lease of the agents' Lease
namespace, so an agent (or a container that stole its token) could keep a dead neighbour "alive" in
the extender's eyes. The shipped ValidatingAdmissionPolicy compares each agent write with the node
named in its pod-bound token. Here on the real apiserver: deploy/'s policy, RBAC and ServiceAccount
(namespaces rewritten to the test's), two Node objects, an agent pod bound to the first, and a
TokenRequest bound to that pod, as kubelet projects it into the agent's container.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, utils

from gpupool.api.agent_lease import lease_name
from gpupool.nodeagent.heartbeat import AgentHeartbeat, HeartbeatSettings
from gpupool.testenv.config import render_kubeconfig
from gpupool.testenv.controlplane import ControlPlane
from tests.deploy.kustomize_render import render, require_kubectl
from tests.e2e.conftest import delete_namespace
from tests.e2e.e2e_support import forbidden_message, ignore_404

pytestmark = [pytest.mark.e2e, pytest.mark.compat]

AGENT_SA = "gpupool-node-agent"
POLICY = "gpupool-agent-lease-own-node"
#: How long the apiserver may take to start enforcing a freshly created policy (its informer).
POLICY_ACTIVE_WITHIN_S = 30.0


def _policy_and_rbac(namespace: str, lease_namespace: str, suffix: str) -> list[dict[str, Any]]:
    """deploy/'s agent ServiceAccount, its Lease Role and binding, and the Lease policy with its
    binding, moved to the test's namespaces (cluster-scoped names get ``suffix``)."""
    require_kubectl()
    wanted = {("ServiceAccount", AGENT_SA), ("Role", "gpupool-node-agent-lease"),
              ("RoleBinding", "gpupool-node-agent-lease"), ("ValidatingAdmissionPolicy", POLICY),
              ("ValidatingAdmissionPolicyBinding", POLICY)}
    docs = [d for d in render("overlays/production") if (d["kind"], d["metadata"]["name"]) in wanted]
    assert {(d["kind"], d["metadata"]["name"]) for d in docs} == wanted
    text = (json.dumps(docs)
            .replace('"gpupool-node-lease"', json.dumps(lease_namespace))
            .replace("system:serviceaccount:gpupool-node:", f"system:serviceaccount:{namespace}:")
            .replace('"gpupool-node"', json.dumps(namespace))
            .replace(json.dumps(POLICY), json.dumps(f"{POLICY}-{suffix}")))
    moved: list[dict[str, Any]] = json.loads(text)
    return moved


@pytest.fixture
def agent_world(control_plane: ControlPlane, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
                namespace: str) -> Iterator[tuple[str, str, str]]:
    """(lease namespace, node of the agent, neighbour node), with deploy/'s policy in force."""
    suffix = uuid.uuid4().hex[:6]
    lease_namespace, node, neighbour = f"{namespace}-lease", f"lease-{suffix}-a", f"lease-{suffix}-b"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=lease_namespace)))
    admission = client.AdmissionregistrationV1Api(kube_api_client)
    docs = _policy_and_rbac(namespace, lease_namespace, suffix)
    try:
        for name in (node, neighbour):
            core_v1.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
        for doc in docs:
            utils.create_from_dict(kube_api_client, doc)
        yield lease_namespace, node, neighbour
    finally:
        for name in (node, neighbour):
            ignore_404(lambda n=name: core_v1.delete_node(n))
        ignore_404(lambda: admission.delete_validating_admission_policy_binding(f"{POLICY}-{suffix}"))
        ignore_404(lambda: admission.delete_validating_admission_policy(f"{POLICY}-{suffix}"))
        delete_namespace(core_v1, lease_namespace)



def _coordination_as(control_plane: ControlPlane, token: str, path: Path) -> client.CoordinationV1Api:
    path.write_text(render_kubeconfig(control_plane.server, token, control_plane.ca_cert.read_bytes()))
    return client.CoordinationV1Api(config.new_client_from_config(config_file=str(path)))


def _token(core_v1: client.CoreV1Api, namespace: str, pod: client.V1Pod | None) -> str:
    """A token of the agent's ServiceAccount: bound to ``pod`` as kubelet's projected token is, or
    bound to nothing (a token minted by hand)."""
    bound = None if pod is None else client.V1BoundObjectReference(
        kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid)
    request = core_v1.create_namespaced_service_account_token(AGENT_SA, namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600, bound_object_ref=bound)))
    return str(request.status.token)


def _lease(name: str, namespace: str, holder: str) -> client.V1Lease:
    return client.V1Lease(metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                          spec=client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=40))



def test_an_agent_writes_only_its_own_nodes_lease(control_plane: ControlPlane, kube_api_client: client.ApiClient,
                                                  core_v1: client.CoreV1Api, namespace: str,
                                                  agent_world: tuple[str, str, str], tmp_path: Path) -> None:
    lease_namespace, node, neighbour = agent_world
    admin = client.CoordinationV1Api(kube_api_client)
    pod = core_v1.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="agent"),
        spec=client.V1PodSpec(node_name=node, service_account_name=AGENT_SA,
                              containers=[client.V1Container(name="agent", image="gpupool:test")])))
    agent = _coordination_as(control_plane, _token(core_v1, namespace, pod), tmp_path / "agent")
    forged = _lease(lease_name(neighbour), lease_namespace, neighbour)

    # The policy is enforced once the apiserver's informer has it; until then a forged write
    # lands, and is removed again by the admin.
    deadline = time.monotonic() + POLICY_ACTIVE_WITHIN_S
    while not (refused := forbidden_message(lambda: agent.create_namespaced_lease(lease_namespace, forged))):
        admin.delete_namespaced_lease(lease_name(neighbour), lease_namespace)
        assert time.monotonic() < deadline, "the Lease policy was never enforced"
        time.sleep(0.5)
    assert f"only its own node's heartbeat Lease {lease_name(node)}" in refused, refused

    # The agent's own heartbeat code, with its pod's token, creates and renews its Lease.
    beat = AgentHeartbeat(agent, node, HeartbeatSettings(namespace=lease_namespace))
    beat.renew_once()
    beat.renew_once()
    assert admin.read_namespaced_lease(lease_name(node), lease_namespace).spec.holder_identity == node

    # A neighbour's existing Lease cannot be renewed by this agent; the admin still can.
    admin.create_namespaced_lease(lease_namespace, forged)
    stale = agent.read_namespaced_lease(lease_name(neighbour), lease_namespace)
    assert "only its own node's heartbeat Lease" in forbidden_message(
        lambda: agent.replace_namespaced_lease(lease_name(neighbour), lease_namespace, stale))
    # Its own Lease's name with the neighbour as holder does not pass either.
    own = admin.read_namespaced_lease(lease_name(node), lease_namespace)
    own.spec.holder_identity = neighbour
    assert forbidden_message(lambda: agent.replace_namespaced_lease(lease_name(node), lease_namespace, own))

    # A token of the same ServiceAccount bound to no pod names no node: refused for every Lease.
    unbound = _coordination_as(control_plane, _token(core_v1, namespace, None), tmp_path / "unbound")
    assert "names no node" in forbidden_message(lambda: unbound.replace_namespaced_lease(
        lease_name(node), lease_namespace, admin.read_namespaced_lease(lease_name(node), lease_namespace)))
