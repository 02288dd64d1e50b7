"""``gpupool certs bootstrap``: one CA, serving and client certificates in Secrets, made once."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import ipaddress
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from kubernetes.client.exceptions import ApiException

from gpupool.cli import certs_cmd
from gpupool.extender.http.cert_secrets import bootstrap, pair_of
from gpupool.extender.http.certificates import hosts_missing, issue_ca, issue_leaf, service_hosts
from tests.extender.tls_world import client_context, post_filter, server_files, serving

HOSTS = service_hosts("gpupool-extender", "kube-system", ("127.0.0.1",))


class FakeSecrets:
    """Secrets of one namespace with the apiserver's 404 / 409 rules (create and replace)."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.writes = 0
        self.version = 0
        self.race: dict[str, Any] | None = None  # created by "someone else" just before our create

    def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        if name not in self.items:
            raise ApiException(status=404, reason="NotFound")
        doc = self.items[name]
        meta = SimpleNamespace(name=name, resource_version=doc["metadata"]["resourceVersion"])
        return SimpleNamespace(metadata=meta, data=dict(doc["data"]))

    def create_namespaced_secret(self, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        if self.race is not None and name in self.race:
            self._store(copy.deepcopy(self.race.pop(name)))
        if name in self.items:
            raise ApiException(status=409, reason="AlreadyExists")
        self._store(body)

    def replace_namespaced_secret(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        if self.items[name]["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self._store(body)

    def _store(self, body: dict[str, Any]) -> None:
        self.version += 1
        self.writes += 1
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(self.version)
        self.items[body["metadata"]["name"]] = body


def test_bootstrap_creates_three_secrets_once() -> None:
    api = FakeSecrets()
    first = bootstrap(api, "kube-system", "tls", HOSTS)
    assert first.written == ["tls-ca", "tls", "tls-client"]
    assert all(api.items[n]["type"] == "kubernetes.io/tls" for n in first.written)
    assert set(api.items["tls"]["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert set(api.items["tls-ca"]["data"]) == {"tls.crt", "tls.key"}
    writes = api.writes
    again = bootstrap(api, "kube-system", "tls", HOSTS)
    assert again.written == [] and api.writes == writes and again.bundle == first.bundle


def test_the_certificates_are_what_go_and_python_verifiers_need() -> None:
    bundle = bootstrap(FakeSecrets(), "kube-system", "tls", HOSTS).bundle
    server, client, ca = bundle.server.certificate, bundle.client.certificate, bundle.ca.certificate
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gpupool-extender.kube-system.svc" in sans.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    eku = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert server.issuer == client.issuer == ca.subject


def test_bootstrapped_certificates_work_for_mutual_tls(tmp_path: Path) -> None:
    from tests.extender.tls_world import Pki

    bundle = bootstrap(FakeSecrets(), "kube-system", "tls", HOSTS).bundle
    pki = Pki(bundle.ca, bundle.server, bundle.client)
    with serving(server_files(pki, tmp_path / "srv")) as served:
        assert post_filter(served.port, client_context(bundle.ca, bundle.client, tmp_path / "c"))[0] == 200


def test_rotate_reissues_the_leaves_from_the_same_ca() -> None:
    api = FakeSecrets()
    first = bootstrap(api, "kube-system", "tls", HOSTS).bundle
    rotated = bootstrap(api, "kube-system", "tls", HOSTS, rotate=True)
    assert rotated.written == ["tls", "tls-client"]
    assert rotated.bundle.ca == first.ca and rotated.bundle.server != first.server
    assert rotated.bundle.server.certificate.issuer == first.ca.certificate.subject


def test_leaves_close_to_expiry_are_renewed_on_the_next_run() -> None:
    api = FakeSecrets()
    bootstrap(api, "kube-system", "tls", HOSTS)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=340)
    assert bootstrap(api, "kube-system", "tls", HOSTS, now=later).written == ["tls", "tls-client"]


def test_a_serving_certificate_lacking_a_name_asked_for_is_issued_again_from_the_same_ca() -> None:
    """An upgrade that adds the webhooks' Service needs its names in the serving certificate."""
    api = FakeSecrets()
    first = bootstrap(api, "kube-system", "tls", HOSTS).bundle
    wider = (*HOSTS, *service_hosts("gpupool-extender-admission", "kube-system"), "10.0.0.9")
    assert hosts_missing(first.server, wider) == [*service_hosts("gpupool-extender-admission", "kube-system"),
                                                  "10.0.0.9"]
    second = bootstrap(api, "kube-system", "tls", wider)
    assert second.written == ["tls"]  # the serving leaf only: the client's names are not hosts
    assert second.bundle.ca == first.ca and hosts_missing(second.bundle.server, wider) == []
    assert bootstrap(api, "kube-system", "tls", wider).written == []  # then stable
    assert bootstrap(api, "kube-system", "tls", HOSTS).written == []  # a subset asked later: kept


def test_a_run_that_loses_the_race_for_the_ca_uses_the_winners() -> None:
    api = FakeSecrets()
    winner = issue_ca("winner")
    api.race = {"tls-ca": {"metadata": {"name": "tls-ca"}, "type": "kubernetes.io/tls",
                           "data": {"tls.crt": base64.b64encode(winner.cert_pem).decode(),
                                    "tls.key": base64.b64encode(winner.key_pem).decode()}}}
    result = bootstrap(api, "kube-system", "tls", HOSTS)
    assert result.bundle.ca == winner and "tls-ca" not in result.written
    assert result.bundle.server.certificate.issuer == winner.certificate.subject


def test_secrets_managed_elsewhere_are_left_alone() -> None:
    api = FakeSecrets()
    api.items["tls"] = {"metadata": {"name": "tls", "resourceVersion": "1"}, "data": {}}
    with pytest.raises(ValueError, match="managed elsewhere"):
        bootstrap(api, "kube-system", "tls", HOSTS)
    assert list(api.items) == ["tls"]


def test_a_secret_without_its_key_is_named() -> None:
    with pytest.raises(ValueError, match=r"has no tls\.key"):
        pair_of(SimpleNamespace(metadata=SimpleNamespace(name="x"), data={"tls.crt": ""}))


def test_a_serving_certificate_needs_a_host() -> None:
    with pytest.raises(ValueError, match="at least one host"):
        issue_leaf(issue_ca(), "x", server=True)


def test_the_command_writes_the_schedulers_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeSecrets()
    monkeypatch.setattr("kubernetes.client.CoreV1Api", lambda *_: api)
    monkeypatch.setattr("gpupool.kube.client_config.api_configuration", lambda *_: None)
    monkeypatch.setattr("kubernetes.client.ApiClient", lambda *_: None)
    args = ["bootstrap", "--secret", "tls", "--host", "10.0.0.7", "--client-dir", str(tmp_path / "sched"),
            "--service", "gpupool-extender", "--service", "gpupool-extender-admission"]
    result = CliRunner().invoke(certs_cmd.certs, args)
    assert result.exit_code == 0, result.output
    assert "wrote Secrets kube-system/tls-ca, kube-system/tls, kube-system/tls-client" in result.output
    key = tmp_path / "sched" / "client.key"
    assert key.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "sched" / "ca.crt").read_bytes() == base64.b64decode(api.items["tls"]["data"]["ca.crt"])
    again = CliRunner().invoke(certs_cmd.certs, args)
    assert again.exit_code == 0 and "already exist; nothing changed" in again.output
    served = pair_of(SimpleNamespace(metadata=SimpleNamespace(name="tls"), data=api.items["tls"]["data"]))
    assert hosts_missing(served, ["gpupool-extender.kube-system.svc", "gpupool-extender-admission.kube-system.svc",
                                  "10.0.0.7"]) == []


def test_the_command_writes_the_ca_into_the_named_webhooks_and_reports_an_absent_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.extender.test_webhook_ca import FakeAdmission, configuration

    secrets, admission = FakeSecrets(), FakeAdmission()
    admission.stored[("mutating", "gpupool-scheduler")] = configuration("mutating", "gpupool-scheduler")
    monkeypatch.setattr("kubernetes.client.CoreV1Api", lambda *_: secrets)
    monkeypatch.setattr("kubernetes.client.AdmissionregistrationV1Api", lambda *_: admission)
    monkeypatch.setattr("gpupool.kube.client_config.api_configuration", lambda *_: None)
    monkeypatch.setattr("kubernetes.client.ApiClient", lambda *_: None)
    args = ["bootstrap", "--secret", "tls", "--webhook", "mutating/gpupool-scheduler",
            "--webhook", "validating/gpupool-quota", "--webhook-wait", "0"]
    result = CliRunner().invoke(certs_cmd.certs, args)
    assert result.exit_code == 0, result.output
    assert "wrote the CA into mutating/gpupool-scheduler" in result.output
    assert "not found after 0 s, left alone: validating/gpupool-quota" in result.output
    assert admission.bundles("mutating", "gpupool-scheduler") == [secrets.items["tls"]["data"]["ca.crt"]]


def test_a_malformed_webhook_flag_is_refused_before_anything_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = FakeSecrets()
    monkeypatch.setattr("kubernetes.client.CoreV1Api", lambda *_: secrets)
    monkeypatch.setattr("gpupool.kube.client_config.api_configuration", lambda *_: None)
    monkeypatch.setattr("kubernetes.client.ApiClient", lambda *_: None)
    result = CliRunner().invoke(certs_cmd.certs, ["bootstrap", "--webhook", "gpupool-scheduler"])
    assert result.exit_code == 2 and "mutating/NAME or validating/NAME" in result.output
    assert secrets.writes == 0
