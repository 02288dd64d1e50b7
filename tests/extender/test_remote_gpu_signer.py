"""The remote GPU signer: a node agent gets a serving certificate for its own node and addresses only.

Requests go through a stand-in apiserver (:class:`FakeCsrApi`) that records who asked, as the real one
does; the issued certificates are then used in real TLS handshakes (Python's ``ssl``) to show that
one node's certificate is refused by a client that dialled another node's address.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpupool.api.remote_gpu_certs import SIGNER_NAME, node_request_pem
from gpupool.extender.http.cert_secrets import ensure_ca, pair_of
from gpupool.extender.http.certificates import issue_ca
from gpupool.extender.remote_gpu_signer import (
    LIFETIME,
    MIN_LIFETIME,
    CaSecret,
    RequestSigner,
    is_pending,
    start_signer,
)
from gpupool.nodeagent.remote_certificate import request_manifest
from tests.extender.csr_fakes import FakeCsrApi, FakeNodes, node_json
from tests.extender.test_cert_bootstrap import FakeSecrets

NODES = {"node-a": node_json("node-a", "127.0.0.1", "10.0.0.1"), "node-b": node_json("node-b", "127.0.0.2")}
NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def ca() -> Any:
    return issue_ca("gpupool-remote-gpu-ca")


def signer(api: FakeCsrApi, ca: Any) -> RequestSigner:
    return RequestSigner(api, ca, NODES.get)


def raw_request(key: Any, common_name: str, sans: Sequence[x509.GeneralName], *,
                extensions: Sequence[x509.ExtensionType] = ()) -> bytes:
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    for extension in extensions:
        builder = builder.add_extension(extension, critical=True)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def ask(api: FakeCsrApi, request_pem: bytes, node: str = "node-a", usages: Sequence[str] | None = None,
        expiration_s: int | None = None) -> dict[str, Any]:
    manifest = request_manifest(node, request_pem)
    if usages is not None:
        manifest["spec"]["usages"] = list(usages)
    if expiration_s is not None:
        manifest["spec"]["expirationSeconds"] = expiration_s
    return api.create_certificate_signing_request(manifest)


def issued(api: FakeCsrApi, name: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(api.items[name]["status"]["certificate"]))


def denial(api: FakeCsrApi, name: str) -> str:
    conditions = api.items[name]["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["Denied"]
    assert "certificate" not in api.items[name]["status"]
    return str(conditions[0]["message"])


def p256() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def test_the_agents_request_is_approved_and_signed_for_its_node(ca: Any) -> None:
    api = FakeCsrApi()
    key = p256()
    created = ask(api, node_request_pem(key, "node-a", ["10.0.0.1", "127.0.0.1"]))
    verdict = signer(api, ca).answer(created, NOW)
    assert verdict is not None and verdict.approved and verdict.node == "node-a"
    name = created["metadata"]["name"]
    assert api.calls == ["create", "approval", "status"]
    assert api.items[name]["status"]["conditions"][0]["type"] == "Approved"
    cert = issued(api, name)
    cert.verify_directly_issued_by(ca.certificate)
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "node-a"
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["node-a"]
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"10.0.0.1", "127.0.0.1"}
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == \
        [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert cert.not_valid_after_utc - NOW == LIFETIME
    assert not is_pending(api.items[name])  # answered once: a second pass leaves it alone
    assert signer(api, ca).answer(api.read_certificate_signing_request(name), NOW) is None


@pytest.mark.parametrize(("token_node", "common_name", "addresses", "reason"), [
    ("node-b", "node-a", ["127.0.0.1"], "the common name 'node-b' alone (the requester's node), not 'CN=node-a'"),
    ("node-a", "node-a", ["127.0.0.2"], "127.0.0.2 is not among node node-a's addresses (10.0.0.1, 127.0.0.1)"),
    ("node-a", "node-a", ["127.0.0.1", "127.0.0.2"], "127.0.0.2 is not among node node-a's addresses"),
    ("node-c", "node-c", ["127.0.0.1"], "127.0.0.1 is not among node node-c's addresses (no such Node)"),
    (None, "node-a", ["127.0.0.1"], "names no node"),
])
def test_a_request_for_another_nodes_name_or_address_is_denied(ca: Any, token_node: str | None, common_name: str,
                                                               addresses: list[str], reason: str) -> None:
    api = FakeCsrApi(node=token_node)
    created = ask(api, node_request_pem(p256(), common_name, addresses), common_name)
    verdict = signer(api, ca).answer(created, NOW)
    assert verdict is not None and not verdict.approved
    assert reason in denial(api, created["metadata"]["name"])
    assert api.calls == ["create", "approval"]


def test_only_the_node_agents_service_account_may_ask(ca: Any) -> None:
    api = FakeCsrApi(username="system:serviceaccount:default:builder")
    created = ask(api, node_request_pem(p256(), "node-a", ["127.0.0.1"]))
    signer(api, ca).answer(created, NOW)
    assert "not the node agents' ServiceAccount" in denial(api, created["metadata"]["name"])


@pytest.mark.parametrize(("sans", "reason"), [
    ([x509.DNSName("gpupool-extender.kube-system.svc"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
     "only the node's name 'node-a'"),
    ([x509.UniformResourceIdentifier("spiffe://cluster/x"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
     "only DNS names and IP addresses"),
    ([x509.DNSName("node-a")], "no IP address asked for"),
    ([], "no IP address asked for"),
])
def test_names_beyond_the_nodes_own_are_denied(ca: Any, sans: list[x509.GeneralName], reason: str) -> None:
    api = FakeCsrApi()
    created = ask(api, raw_request(p256(), "node-a", sans))
    signer(api, ca).answer(created, NOW)
    assert reason in denial(api, created["metadata"]["name"])


@pytest.mark.parametrize(("usages", "approved"), [
    (["digital signature", "client auth"], False),
    (["digital signature", "server auth", "client auth"], False),
    (["digital signature", "server auth", "cert sign"], False),
    (["digital signature", "key encipherment", "server auth"], True),
])
def test_usages_are_server_auth_only(ca: Any, usages: list[str], approved: bool) -> None:
    api = FakeCsrApi()
    created = ask(api, node_request_pem(p256(), "node-a", ["127.0.0.1"]), usages=usages)
    verdict = signer(api, ca).answer(created, NOW)
    assert verdict is not None and verdict.approved is approved


def test_weak_keys_and_broken_signatures_are_denied(ca: Any) -> None:
    api = FakeCsrApi()
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    created = ask(api, raw_request(weak, "node-a", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]))
    signer(api, ca).answer(created, NOW)
    assert "1024 bits is shorter than 2048" in denial(api, created["metadata"]["name"])

    good = node_request_pem(p256(), "node-a", ["127.0.0.1"])
    der = bytearray(x509.load_pem_x509_csr(good).public_bytes(serialization.Encoding.DER))
    der[-3] ^= 0x55  # inside the signature
    tampered = b"-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(bytes(der)) + \
        b"-----END CERTIFICATE REQUEST-----\n"
    created = ask(api, tampered)
    signer(api, ca).answer(created, NOW)
    assert "signature does not hold" in denial(api, created["metadata"]["name"])


def test_the_certificate_is_built_from_the_signers_template_not_the_request(ca: Any) -> None:
    api = FakeCsrApi()
    asks_for_a_ca = raw_request(p256(), "node-a", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
                                extensions=[x509.BasicConstraints(ca=True, path_length=None)])
    created = ask(api, asks_for_a_ca)
    assert signer(api, ca).answer(created, NOW) is not None
    cert = issued(api, created["metadata"]["name"])
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


@pytest.mark.parametrize(("asked", "lives"), [(None, LIFETIME), (3600, dt.timedelta(hours=1)),
                                              (60, MIN_LIFETIME), (10**9, LIFETIME)])
def test_expiration_seconds_shortens_the_life_within_bounds(ca: Any, asked: int | None, lives: dt.timedelta) -> None:
    api = FakeCsrApi()
    created = ask(api, node_request_pem(p256(), "node-a", ["127.0.0.1"]), expiration_s=asked)
    signer(api, ca).answer(created, NOW)
    assert issued(api, created["metadata"]["name"]).not_valid_after_utc - NOW == lives


def test_requests_of_other_signers_and_answered_ones_are_left_alone(ca: Any) -> None:
    api = FakeCsrApi()
    created = ask(api, node_request_pem(p256(), "node-a", ["127.0.0.1"]))
    other = {**created, "spec": {**created["spec"], "signerName": "kubernetes.io/kubelet-serving"}}
    denied = {**created, "status": {"conditions": [{"type": "Denied", "status": "True"}]}}
    assert signer(api, ca).answer_all([other, denied], NOW) == []
    assert api.calls == ["create"]
    assert created["spec"]["signerName"] == SIGNER_NAME


def _handshake(cert_pem: bytes, key: ec.EllipticCurvePrivateKey, ca_pem: bytes, listen: str, tmp: Path) -> str:
    """Serve TLS on ``listen`` with the certificate, dial it as a client trusting ``ca_pem`` and checking
    the address dialled; "" when the handshake holds, else the client's error."""
    (tmp / "crt").write_bytes(cert_pem)
    (tmp / "key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp / "crt", tmp / "key")
    client = ssl.create_default_context(cadata=ca_pem.decode())
    with socket.create_server((listen, 0)) as listener:
        port = listener.getsockname()[1]

        def accept() -> None:
            conn, _ = listener.accept()
            try:
                with server.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            with socket.create_connection((listen, port), timeout=5) as raw, \
                    client.wrap_socket(raw, server_hostname=listen):
                return ""
        except ssl.SSLCertVerificationError as exc:
            return str(exc.verify_message)
        finally:
            thread.join(5)


def test_one_nodes_certificate_does_not_pass_for_another_nodes_address(ca: Any, tmp_path: Path) -> None:
    api = FakeCsrApi(node="node-a")
    key = p256()
    created = ask(api, node_request_pem(key, "node-a", ["127.0.0.1"]))
    signer(api, ca).answer(created, NOW)
    cert_pem = issued(api, created["metadata"]["name"]).public_bytes(serialization.Encoding.PEM)
    assert _handshake(cert_pem, key, ca.cert_pem, "127.0.0.1", tmp_path) == ""
    # node-a's key and certificate serving on node-b's address (127.0.0.2): the client refuses it
    assert "IP address mismatch" in _handshake(cert_pem, key, ca.cert_pem, "127.0.0.2", tmp_path)


def test_the_extenders_loop_answers_pending_requests_on_the_leader_only(ca: Any) -> None:
    api = FakeCsrApi()
    created = ask(api, node_request_pem(p256(), "node-a", ["127.0.0.1"]))
    secrets = FakeSecrets()
    leading = threading.Event()
    stop = threading.Event()
    thread = start_signer(api, FakeNodes(NODES), CaSecret(secrets, "kube-system", "gpupool-remote-gpu-ca"),
                          stop, leading.is_set, every_s=0.01)
    try:
        for _ in range(20):  # a follower only waits
            time.sleep(0.01)
        assert is_pending(api.items[created["metadata"]["name"]])
        leading.set()  # the leader, but no CA Secret yet: nothing signed, looked for again
        for _ in range(20):
            time.sleep(0.01)
        assert is_pending(api.items[created["metadata"]["name"]])
        ensure_ca(secrets, "kube-system", "gpupool-remote-gpu-ca", "gpupool-remote-gpu-ca")
        for _ in range(500):
            if not is_pending(api.items[created["metadata"]["name"]]):
                break
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(5)
    signed_by = pair_of(secrets.read_namespaced_secret("gpupool-remote-gpu-ca", "kube-system"))
    issued(api, created["metadata"]["name"]).verify_directly_issued_by(signed_by.certificate)
    assert f"list spec.signerName={SIGNER_NAME}" in api.calls


def test_certs_remote_gpu_ca_makes_the_signers_ca_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from gpupool.cli import certs_cmd

    secrets = FakeSecrets()
    monkeypatch.setattr("kubernetes.client.CoreV1Api", lambda *_: secrets)
    monkeypatch.setattr("gpupool.kube.client_config.api_configuration", lambda *_: None)
    monkeypatch.setattr("kubernetes.client.ApiClient", lambda *_: None)
    first = CliRunner().invoke(certs_cmd.certs, ["remote-gpu-ca"])
    assert first.exit_code == 0 and "wrote Secret kube-system/gpupool-remote-gpu-ca" in first.output
    made = secrets.items["gpupool-remote-gpu-ca"]
    again = CliRunner().invoke(certs_cmd.certs, ["remote-gpu-ca"])
    assert again.exit_code == 0 and "already exists" in again.output
    assert secrets.items["gpupool-remote-gpu-ca"] == made and set(made["data"]) == {"tls.crt", "tls.key"}
    pair = CaSecret(secrets, "kube-system", "gpupool-remote-gpu-ca").get()
    assert pair is not None and pair.certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_missing_ca_is_logged_with_the_command_that_makes_it(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="gpupool.extender.remote_gpu_signer"):
        assert CaSecret(FakeSecrets(), "gpupool-system", "gpupool-remote-gpu-ca").get() is None
    (record,) = caplog.records
    assert record.getMessage().endswith(
        "until it exists: gpupool certs remote-gpu-ca --namespace gpupool-system --secret gpupool-remote-gpu-ca")


def test_the_extenders_flag_names_the_ca_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from gpupool.api.cluster_settings import ClusterSettings
    from gpupool.cli import cluster_options, extender_cmd
    from gpupool.cli.main import cli

    seen: list[Any] = []
    monkeypatch.setattr(extender_cmd, "run_extender", seen.append)
    monkeypatch.setattr(cluster_options, "read_with_client", lambda _k: lambda _w: ClusterSettings())
    bad = CliRunner().invoke(cli, ["extender", "--remote-gpu-signer", "gpupool-remote-gpu-ca"])
    assert bad.exit_code == 2 and "expected NAMESPACE/SECRET" in bad.output
    good = CliRunner().invoke(cli, ["extender", "--remote-gpu-signer", "kube-system/gpupool-remote-gpu-ca"])
    assert good.exit_code == 0, good.output
    assert seen[0].remote_gpu_signer == ("kube-system", "gpupool-remote-gpu-ca")
    CliRunner().invoke(cli, ["extender"])
    assert seen[1].remote_gpu_signer is None
