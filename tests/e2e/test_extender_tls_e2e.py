"""The real kube-scheduler (v1.37.2) talks to the extender over mutual TLS; other clients are refused.

Certificates come from ``gpupool certs bootstrap``'s issuer (a CA, a serving certificate for
127.0.0.1, a client certificate); the scheduler's extender entry has ``enableHTTPS: true`` and a
``tlsConfig`` with ``certFile``/``keyFile``/``caFile``. Nodes are API objects with an
``inventory-v1`` (no kubelet), so pods end bound, which is the scheduler's and extender's part.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from kubernetes import client

from gpupool.api.annotations import Inventory, decode_assignment, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.cli.certs_cmd import certs
from gpupool.core.model import GpuCard
from gpupool.extender.http.cert_secrets import bootstrap, pair_of
from gpupool.extender.http.certificates import KeyPair, issue_ca, issue_leaf
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import MakeNode, gpu_pod_manifest, wait_for
from tests.e2e.trust_support import FlaggedExtender, TlsExtenderConfig

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
CARD_MIB = 16384


def write(directory: Path, **files: bytes) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, data in files.items():
        path = directory / name.replace("_", ".")
        path.write_bytes(data)
        out[name] = path
    return out


class Certs:
    def __init__(self, directory: Path) -> None:
        self.ca = issue_ca("e2e-ca")
        self.server = issue_leaf(self.ca, "gpupool-extender", server=True, hosts=("127.0.0.1",))
        self.client = issue_leaf(self.ca, "kube-scheduler", server=False)
        self.stranger_ca = issue_ca("stranger-ca")
        self.stranger = issue_leaf(self.stranger_ca, "kube-scheduler", server=False)
        self.server_files = write(directory / "server", tls_crt=self.server.cert_pem, tls_key=self.server.key_pem,
                                  ca_crt=self.ca.cert_pem)
        self.scheduler_files = write(directory / "scheduler", client_crt=self.client.cert_pem,
                                     client_key=self.client.key_pem, ca_crt=self.ca.cert_pem)
        self.directory = directory


@pytest.fixture(scope="module")
def tls_extender(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[FlaggedExtender, Certs]]:
    """The extender over mutual TLS, and kube-scheduler restarted to call it with its client certificate."""
    base = tmp_path_factory.mktemp("tls")
    certs = Certs(base)
    files = certs.server_files
    extender = FlaggedExtender(control_plane.kubeconfig, base / "extender.log", tls=True, extra_args=(
        "--tls-cert-file", str(files["tls_crt"]), "--tls-private-key-file", str(files["tls_key"]),
        "--client-ca-file", str(files["ca_crt"]), "--tls-reload-interval", "0.5"))
    extender.start()
    scheduler = certs.scheduler_files
    control_plane.restart_scheduler([TlsExtenderConfig(
        url_prefix=extender.url, filter_verb="filter", prioritize_verb="prioritize", bind_verb="bind", weight=5,
        node_cache_capable=True, managed_resources=NAMES.managed(), http_timeout_s=10.0,
        tls_config={"certFile": str(scheduler["client_crt"]), "keyFile": str(scheduler["client_key"]),
                    "caFile": str(scheduler["ca_crt"])})])
    try:
        yield extender, certs
    finally:
        extender.kill()
        control_plane.restart_scheduler([])


def gpu_node(make_node: MakeNode) -> str:
    name = f"tls-{uuid.uuid4().hex[:6]}"
    cards = tuple(GpuCard(i, f"GPU-{name}-{i}", "Tesla-T4", CARD_MIB) for i in range(2))
    return make_node(name, {"cpu": "16", "memory": "64Gi", "pods": "110"},
                     annotations={NAMES.inventory: encode_inventory(Inventory(cards))})


def bound_node(core_v1: client.CoreV1Api, namespace: str, name: str) -> str | None:
    node = core_v1.read_namespaced_pod(name, namespace).spec.node_name
    return str(node) if node else None


def client_context(trust: KeyPair, identity: KeyPair | None, directory: Path) -> ssl.SSLContext:
    files = write(directory, trust_crt=trust.cert_pem)
    context = ssl.create_default_context(cafile=str(files["trust_crt"]))
    if identity is not None:
        mine = write(directory, me_crt=identity.cert_pem, me_key=identity.key_pem)
        context.load_cert_chain(str(mine["me_crt"]), str(mine["me_key"]))
    return context


def post_filter(extender: FlaggedExtender, context: ssl.SSLContext, node: str) -> tuple[int, dict[str, object]]:
    body = json.dumps({"Pod": gpu_pod_manifest("probe", [("main", {NAMES.gpu_mem: "16"})]) | {
        "metadata": {"name": "probe", "namespace": "default", "uid": "probe-uid"}}, "NodeNames": [node]})
    conn = http.client.HTTPSConnection("127.0.0.1", extender.port, context=context, timeout=10)
    try:
        conn.request("POST", "/filter", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_the_scheduler_binds_gpu_pods_through_mutual_tls(
        tls_extender: tuple[FlaggedExtender, Certs], core_v1: client.CoreV1Api, namespace: str,
        make_node: MakeNode) -> None:
    extender, _ = tls_extender
    node = gpu_node(make_node)
    started = time.monotonic()
    for i in range(3):
        core_v1.create_namespaced_pod(namespace, gpu_pod_manifest(f"p{i}", [("main", {NAMES.gpu_mem: "16"})]))
    for i in range(3):
        assert wait_for(lambda i=i: bound_node(core_v1, namespace, f"p{i}"), timeout=60,
                        what=f"p{i} bound through the TLS extender\n{extender.log_path.read_text()[-2000:]}") == node
        pod = core_v1.read_namespaced_pod(f"p{i}", namespace)
        assert decode_assignment(pod.metadata.annotations[NAMES.assignment]).node == node
    print(f"\n3 pods bound over mutual TLS in {time.monotonic() - started:.1f} s")


def test_clients_without_the_right_certificate_are_refused(
        tls_extender: tuple[FlaggedExtender, Certs], make_node: MakeNode, tmp_path: Path) -> None:
    extender, certs = tls_extender
    node = gpu_node(make_node)
    status, body = post_filter(extender, client_context(certs.ca, certs.client, tmp_path / "ok"), node)
    assert status == 200 and body["NodeNames"] == [node]
    for who, identity in (("none", None), ("stranger", certs.stranger)):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            post_filter(extender, client_context(certs.ca, identity, tmp_path / who), node)
    # a client that does not check the server is still refused without a certificate
    anonymous = ssl.create_default_context()
    anonymous.check_hostname, anonymous.verify_mode = False, ssl.CERT_NONE
    with pytest.raises((ssl.SSLError, ConnectionError)):
        post_filter(extender, anonymous, node)
    # and the plain health port serves no verb
    conn = http.client.HTTPConnection("127.0.0.1", extender.health_port, timeout=5)
    conn.request("POST", "/filter", b"{}")
    assert conn.getresponse().status in (404, 405)
    conn.close()


def test_a_rotated_serving_certificate_is_used_without_a_restart(
        tls_extender: tuple[FlaggedExtender, Certs], core_v1: client.CoreV1Api, namespace: str,
        make_node: MakeNode, tmp_path: Path) -> None:
    """cert-manager renews the serving certificate (same CA): new connections get the new one, and
    the scheduler keeps binding."""
    extender, certs = tls_extender
    assert extender.proc is not None
    pid = extender.proc.pid
    renewed = issue_leaf(certs.ca, "gpupool-extender", server=True, hosts=("127.0.0.1",))
    files = certs.server_files
    files["tls_key"].write_bytes(renewed.key_pem)
    files["tls_crt"].write_bytes(renewed.cert_pem)
    context = client_context(certs.ca, certs.client, tmp_path / "c")

    def serial() -> int | None:
        with ssl.create_connection(("127.0.0.1", extender.port), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
        from cryptography import x509
        return x509.load_der_x509_certificate(der).serial_number if der else None

    wait_for(lambda: serial() == renewed.certificate.serial_number, timeout=20, what="the renewed certificate served")
    node = gpu_node(make_node)
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("after", [("main", {NAMES.gpu_mem: "16"})]))
    assert wait_for(lambda: bound_node(core_v1, namespace, "after"), timeout=60, what="a bind after rotation") == node
    assert extender.proc.pid == pid and extender.proc.poll() is None


def test_certs_bootstrap_against_the_real_apiserver_is_idempotent(
        control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str, tmp_path: Path) -> None:
    """``gpupool certs bootstrap`` with the control plane's kubeconfig: three Secrets made once, read
    back by the next run, rotated with the resourceVersion precondition; the client files it writes
    work for mutual TLS against the serving Secret."""
    args = ["bootstrap", "--namespace", namespace, "--secret", "ext-tls", "--host", "127.0.0.1",
            "--kubeconfig", str(control_plane.kubeconfig), "--client-dir", str(tmp_path / "client")]
    first = CliRunner().invoke(certs, args)
    assert first.exit_code == 0, first.output
    stored = {s.metadata.name: s for s in core_v1.list_namespaced_secret(namespace).items}
    assert {"ext-tls", "ext-tls-client", "ext-tls-ca"} <= set(stored)
    assert stored["ext-tls"].type == "kubernetes.io/tls"
    again = CliRunner().invoke(certs, args)
    assert again.exit_code == 0 and "nothing changed" in again.output
    assert core_v1.read_namespaced_secret("ext-tls", namespace).metadata.resource_version == \
        stored["ext-tls"].metadata.resource_version
    ca = pair_of(stored["ext-tls-ca"])
    rotated = bootstrap(core_v1, namespace, "ext-tls", ("127.0.0.1",), rotate=True)
    assert rotated.written == ["ext-tls", "ext-tls-client"] and rotated.bundle.ca == ca
    client_files = tmp_path / "client"
    assert (client_files / "ca.crt").read_bytes() == ca.cert_pem
