"""A node agent serving remote GPUs writes only its client pods' token Secrets
(deploy/kustomize/components/remote-gpu: the RBAC grants create/patch of Secrets everywhere, the
ValidatingAdmissionPolicy narrows it). On the real apiserver: the component's RBAC and policy
(namespaces rewritten to the test's), the agent's own ``write_secret`` with a token of the agent's
ServiceAccount, and the Secrets a stolen token would try to write instead.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config, utils

from gpupool.nodeagent.remote_server import ServedShare, token_secret
from gpupool.nodeagent.remote_setup import write_secret
from gpupool.testenv.config import render_kubeconfig
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import forbidden_message, ignore_404

pytestmark = pytest.mark.e2e

COMPONENT = Path(__file__).resolve().parents[2] / "deploy" / "kustomize" / "components" / "remote-gpu"
AGENT_SA = "gpupool-node-agent"
POLICY = "gpupool-agent-remote-gpu-secrets"
POLICY_ACTIVE_WITHIN_S = 30.0
"""How long the apiserver may take to start enforcing a freshly created policy (its informer)."""


def _component(namespace: str, suffix: str) -> list[dict[str, Any]]:
    """The component's RBAC and policy, the agent's namespace rewritten to the test's and
    cluster-scoped names given ``suffix``."""
    docs = [d for name in ("node-agent-remote-gpu-rbac.yaml", "node-agent-remote-gpu-policy.yaml")
            for d in yaml.safe_load_all((COMPONENT / name).read_text()) if d]
    text = (json.dumps(docs)
            .replace("system:serviceaccount:gpupool-node:", f"system:serviceaccount:{namespace}:")
            .replace('"gpupool-node"', json.dumps(namespace))
            .replace('"gpupool-node-agent-remote-gpu"', json.dumps(f"gpupool-node-agent-remote-gpu-{suffix}"))
            .replace(json.dumps(POLICY), json.dumps(f"{POLICY}-{suffix}")))
    moved: list[dict[str, Any]] = json.loads(text)
    return moved


@pytest.fixture
def agent_core_v1(control_plane: ControlPlane, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
                  namespace: str, tmp_path: Path) -> Iterator[client.CoreV1Api]:
    """The CoreV1Api of a node agent (its ServiceAccount's token), with the component in force."""
    suffix = uuid.uuid4().hex[:6]
    core_v1.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name=AGENT_SA)))
    docs = _component(namespace, suffix)
    for doc in docs:
        utils.create_from_dict(kube_api_client, doc)
    token = core_v1.create_namespaced_service_account_token(AGENT_SA, namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token
    kubeconfig = tmp_path / "agent"
    kubeconfig.write_text(render_kubeconfig(control_plane.server, token, control_plane.ca_cert.read_bytes()))
    try:
        yield client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    finally:
        admission = client.AdmissionregistrationV1Api(kube_api_client)
        rbac = client.RbacAuthorizationV1Api(kube_api_client)
        for call in (lambda: admission.delete_validating_admission_policy_binding(f"{POLICY}-{suffix}"),
                     lambda: admission.delete_validating_admission_policy(f"{POLICY}-{suffix}"),
                     lambda: rbac.delete_cluster_role_binding(f"gpupool-node-agent-remote-gpu-{suffix}"),
                     lambda: rbac.delete_cluster_role(f"gpupool-node-agent-remote-gpu-{suffix}")):
            ignore_404(call)




def _secret(name: str, namespace: str, owner: client.V1Pod | None, data: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner.metadata.name,
                                    "uid": owner.metadata.uid}]
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta, "stringData": data}


def test_the_agent_writes_its_clients_token_secrets_and_nothing_else(
        core_v1: client.CoreV1Api, namespace: str, agent_core_v1: client.CoreV1Api) -> None:
    pod = core_v1.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="train-0"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="gpupool:test")])))
    stolen = _secret("db-password", namespace, None, {"password": "x"})

    # Until the apiserver's informer has the policy a forged write lands (the RBAC allows it); the
    # admin removes it and the test tries again.
    deadline = time.monotonic() + POLICY_ACTIVE_WITHIN_S
    while not (refused := forbidden_message(lambda: agent_core_v1.create_namespaced_secret(namespace, stolen))):
        core_v1.delete_namespaced_secret("db-password", namespace)
        assert time.monotonic() < deadline, "the Secret policy was never enforced"
        time.sleep(0.5)
    assert "only a client pod's token Secret <pod>-gpupool-remote owned by that pod, not db-password" in refused

    # The agent's own code: created, then patched with a new token (409 -> patch), CA included.
    share = ServedShare(f"{namespace}/train-0", pod.metadata.uid, "GPU-0", 4096, 50)
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    write_secret(agent_core_v1, token_secret(share, "first", "10.0.0.7:9420", ca))
    write_secret(agent_core_v1, token_secret(share, "second", "10.0.0.7:9420", ca))
    written = core_v1.read_namespaced_secret("train-0-gpupool-remote", namespace)
    assert sorted(written.data) == ["remote_endpoint", "remote_tls_ca.pem", "remote_token"]

    # What a stolen agent token could try instead: each refused.
    other = core_v1.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="other"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="gpupool:test")])))
    for name, owner, data in (("train-0-gpupool-remote-x", pod, {"remote_token": "t"}),  # not the owner's name
                              ("other-gpupool-remote", None, {"remote_token": "t"}),      # owned by nobody
                              ("other-gpupool-remote", pod, {"remote_token": "t"}),       # owned by another pod
                              ("other-gpupool-remote", other, {"ssh-privatekey": "k"})):  # keys it never writes
        assert forbidden_message(lambda n=name, o=owner, d=data: agent_core_v1.create_namespaced_secret(
            namespace, _secret(n, namespace, o, d))), name
    # Nor can it rewrite its client's Secret into something else.
    assert "holds only remote_endpoint, remote_token and remote_tls_ca.pem" in forbidden_message(
        lambda: agent_core_v1.patch_namespaced_secret("train-0-gpupool-remote", namespace,
                                                      {"stringData": {"extra": "x"}}))
