"""A node agent serving remote GPUs writes only its client pods' token Secrets
(deploy/kustomize/components/remote-gpu: the RBAC grants create/patch of Secrets everywhere, the
ValidatingAdmissionPolicy narrows it). On the real apiserver: the component's RBAC and policy
(namespaces rewritten to the test's), the agent's own ``write_secret`` with a token of the agent's
ServiceAccount, and the Secrets a stolen token would try to write instead.
"""

from __future__ import annotations

import json
import os
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


NODE_CERTIFICATES = COMPONENT.parent / "remote-gpu-node-certificates" / "remote-gpu-node-certificates-rbac.yaml"


def _token(core_v1: client.CoreV1Api, account: str, namespace: str, pod: client.V1Pod | None = None) -> str:
    """A ServiceAccount token; bound to ``pod`` (which then names the pod's node) when given."""
    bound = client.V1BoundObjectReference(api_version="v1", kind="Pod", name=pod.metadata.name,
                                          uid=pod.metadata.uid) if pod is not None else None
    answer = core_v1.create_namespaced_service_account_token(account, namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600, bound_object_ref=bound)))
    return str(answer.status.token)


def _api_client(control_plane: ControlPlane, token: str, path: Path) -> client.ApiClient:
    path.write_text(render_kubeconfig(control_plane.server, token, control_plane.ca_cert.read_bytes()))
    return config.new_client_from_config(config_file=str(path))


def _make_ca_as_the_certificate_job(control_plane: ControlPlane, kube_api_client: client.ApiClient,
                                    core_v1: client.CoreV1Api, namespace: str, tmp_path: Path) -> None:
    """The CA Secret made as kustomize's certificate Job makes it with components/certs-bootstrap and
    remote-gpu-node-certificates: its second container's command, run twice (the second finds it),
    as the Job's ServiceAccount with the rendered Role (the Secret it may read back by name)."""
    from click.testing import CliRunner

    from gpupool.cli.main import cli
    from tests.deploy.kustomize_render import KUSTOMIZE, render

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(KUSTOMIZE / "base", overlay)],
        "components": [os.path.relpath(KUSTOMIZE / "components" / c, overlay)
                       for c in ("certs-bootstrap", "remote-gpu", "remote-gpu-node-certificates")]}))
    docs = render(str(overlay))
    (job,) = [d for d in docs if d["kind"] == "Job"]
    (args,) = [c["args"] for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "remote-gpu-ca"]
    certs = [d for d in docs if d["metadata"]["name"] == "gpupool-certs" and d["kind"] in
             ("ServiceAccount", "Role", "RoleBinding")]
    assert len(certs) == 3
    for doc in json.loads(json.dumps(certs).replace('"gpupool-system"', json.dumps(namespace))):
        utils.create_from_dict(kube_api_client, doc)
    kubeconfig = tmp_path / "certs-kubeconfig"
    kubeconfig.write_text(render_kubeconfig(control_plane.server, _token(core_v1, "gpupool-certs", namespace),
                                            control_plane.ca_cert.read_bytes()))
    args = [a.replace("=gpupool-system", f"={namespace}") for a in args]
    for said in ("wrote Secret", "already exists"):
        done = CliRunner().invoke(cli, [*args, f"--kubeconfig={kubeconfig}"])
        assert done.exit_code == 0 and said in done.output, done.output


def test_a_gpu_node_gets_a_certificate_for_itself_only(control_plane: ControlPlane, kube_api_client: client.ApiClient,
                                                       core_v1: client.CoreV1Api, namespace: str,
                                                       tmp_path: Path) -> None:
    """components/remote-gpu-node-certificates on the real apiserver: the CA made by the certificate Job's
    command with the Job's RBAC; the agent's CertificateSigningRequest sent with its pod-bound token,
    denied while the Node lacks the address, then asked again as a new request and approved and signed by
    the extender's signer running as the extender's ServiceAccount with the component's RBAC; a request
    for another node's name or without a pod-bound token is denied with the reason."""
    import threading

    from cryptography import x509

    from gpupool.extender.remote_gpu_signer import CaSecret, start_signer
    from gpupool.nodeagent.remote_certificate import CertificateDenied, CertificateRefused, ServerCertificate

    suffix = uuid.uuid4().hex[:6]
    docs = [d for d in yaml.safe_load_all(NODE_CERTIFICATES.read_text()) if d]
    names = [d["metadata"]["name"] for d in docs if d["kind"].startswith("Cluster")]
    text = json.dumps(docs).replace('"gpupool-node"', json.dumps(namespace)).replace(
        '"gpupool-system"', json.dumps(namespace))
    for name in names:
        text = text.replace(json.dumps(name), json.dumps(f"{name}-{suffix}"))
    for account in ("gpupool-node-agent", "gpupool-extender"):
        core_v1.create_namespaced_service_account(namespace, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name=account)))
    for doc in json.loads(text):
        utils.create_from_dict(kube_api_client, doc)
    nodes = {f"e2e-gpu-{suffix}": "10.99.0.7", f"e2e-gpu-other-{suffix}": "10.99.0.8"}
    pods = {}
    for node, address in nodes.items():
        address = "10.99.0.6" if node == f"e2e-gpu-{suffix}" else address  # until the test fixes the Node
        core_v1.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                             "status": {"addresses": [{"type": "InternalIP", "address": address}]}})
        pods[node] = core_v1.create_namespaced_pod(namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"agent-{node}"),
            spec=client.V1PodSpec(node_name=node, service_account_name="gpupool-node-agent",
                                  containers=[client.V1Container(name="a", image="gpupool:test")])))
    node, other = list(nodes)
    certificates = client.CertificatesV1Api(kube_api_client)
    stop = threading.Event()
    try:
        _make_ca_as_the_certificate_job(control_plane, kube_api_client, core_v1, namespace, tmp_path)
        extender = _api_client(control_plane, _token(core_v1, "gpupool-extender", namespace), tmp_path / "extender")
        start_signer(client.CertificatesV1Api(extender), client.CoreV1Api(extender),
                     CaSecret(client.CoreV1Api(extender), namespace, "gpupool-remote-gpu-ca"), stop, lambda: True,
                     every_s=0.2, agent_username=f"system:serviceaccount:{namespace}:gpupool-node-agent")

        def agent(pod_node: str | None) -> client.CertificatesV1Api:
            token = _token(core_v1, "gpupool-node-agent", namespace, pods[pod_node] if pod_node else None)
            return client.CertificatesV1Api(_api_client(control_plane, token, tmp_path / f"agent-{pod_node}"))

        keeper = ServerCertificate(agent(node), node, [nodes[node]], tmp_path / "node")
        with pytest.raises(CertificateDenied, match=r"10\.99\.0\.7 is not among node"):
            keeper.obtain(wait_s=30, poll_s=0.2)
        core_v1.patch_node_status(node, {"status": {"addresses": [{"type": "InternalIP", "address": nodes[node]}]}})
        cert = keeper.obtain(wait_s=30, poll_s=0.2)  # a new request: the denied one keeps its answer
        asked = {r.metadata.name: [c.type for c in r.status.conditions or ()]
                 for r in certificates.list_certificate_signing_request().items if node in r.metadata.name}
        assert sorted(asked.values()) == [["Approved"], ["Denied"]]
        ca = x509.load_pem_x509_certificate((keeper.ca_pem() or "").encode())
        cert.verify_directly_issued_by(ca)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert sans.get_values_for_type(x509.DNSName) == [node]
        assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == [nodes[node]]

        # the other node's agent asking for this node's name and address; an agent token bound to no pod
        with pytest.raises(CertificateRefused, match=f"the common name '{other}' alone"):
            ServerCertificate(agent(other), node, [nodes[node]], tmp_path / "forged").obtain(wait_s=30, poll_s=0.2)
        with pytest.raises(CertificateRefused, match="names no node"):
            ServerCertificate(agent(None), node, [nodes[node]], tmp_path / "unbound").obtain(wait_s=30, poll_s=0.2)
    finally:
        stop.set()
        rbac = client.RbacAuthorizationV1Api(kube_api_client)
        for request in certificates.list_certificate_signing_request().items:
            if node in request.metadata.name:
                ignore_404(lambda n=request.metadata.name: certificates.delete_certificate_signing_request(n))
        for name in names:
            ignore_404(lambda n=name: rbac.delete_cluster_role_binding(f"{n}-{suffix}"))
            ignore_404(lambda n=name: rbac.delete_cluster_role(f"{n}-{suffix}"))
        for name in nodes:
            ignore_404(lambda n=name: core_v1.delete_node(n))
