"""The extender over mutual TLS: who is refused, what the health port serves, and certificate
rotation without a restart (plain Python clients against the real server on loopback)."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import click
import pytest

from gpupool.cli.extender_cmd import tls_files
from gpupool.extender.http.tls import ReloadingTls, TlsConfigError, TlsFiles
from tests.extender.tls_world import Pki, client_context, get_plain, post_filter, server_files, serving, write


@pytest.fixture(scope="module")
def pki() -> Pki:
    return Pki.make("cluster")


@pytest.fixture(scope="module")
def stranger() -> Pki:
    return Pki.make("stranger")


def test_a_client_with_a_certificate_from_the_client_ca_gets_answers(pki: Pki, tmp_path: Path) -> None:
    with serving(server_files(pki, tmp_path / "srv")) as served:
        status, body = post_filter(served.port, client_context(pki.ca, pki.client, tmp_path / "c"))
    assert status == 200 and body["NodeNames"] == ["N1"]


@pytest.mark.parametrize("who", [
    pytest.param("no-certificate", id="no-certificate"),
    pytest.param("other-ca", id="certificate-from-another-ca"),
    pytest.param("server-cert-as-client", id="serving-certificate-used-as-client"),
])
def test_clients_without_a_valid_client_certificate_are_refused_at_the_handshake(
        pki: Pki, stranger: Pki, tmp_path: Path, who: str) -> None:
    identity = {"no-certificate": None, "other-ca": stranger.client, "server-cert-as-client": stranger.server}[who]
    with serving(server_files(pki, tmp_path / "srv")) as served:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            post_filter(served.port, client_context(pki.ca, identity, tmp_path / "c"))
        # and the server is unharmed: the right client still gets its answer
        assert post_filter(served.port, client_context(pki.ca, pki.client, tmp_path / "ok"))[0] == 200


def test_the_health_port_serves_probes_and_metrics_only_in_plain_http(pki: Pki, tmp_path: Path) -> None:
    with serving(server_files(pki, tmp_path / "srv")) as served:
        assert get_plain(served.health_port, "/healthz") == 200
        assert get_plain(served.health_port, "/readyz") == 200
        assert get_plain(served.health_port, "/metrics") == 200
        assert get_plain(served.health_port, "/filter") == 404  # no verb without a certificate


def test_new_certificates_are_served_without_a_restart(pki: Pki, stranger: Pki, tmp_path: Path) -> None:
    """Rotation to another CA: after the reload new connections present the new serving
    certificate and accept only clients of the new CA."""
    files = server_files(pki, tmp_path / "srv")
    with serving(files) as served:
        old_client = client_context(pki.ca, pki.client, tmp_path / "old")
        new_client = client_context(stranger.ca, stranger.client, tmp_path / "new")
        assert post_filter(served.port, old_client)[0] == 200
        assert not served.tls.reload_if_changed()  # nothing changed yet
        server_files(stranger, tmp_path / "srv")
        os.utime(files.cert_file, ns=(1, 1))  # a different stamp even within one clock tick
        assert served.tls.reload_if_changed() and served.tls.reloads == 1
        assert post_filter(served.port, new_client)[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            post_filter(served.port, old_client)


def test_a_half_written_rotation_keeps_the_previous_certificates(pki: Pki, stranger: Pki, tmp_path: Path) -> None:
    files = server_files(pki, tmp_path / "srv")
    with serving(files) as served:
        Path(files.cert_file).write_bytes(stranger.server.cert_pem)  # the new certificate beside the old key
        assert not served.tls.reload_if_changed() and served.tls.failures == 1
        assert post_filter(served.port, client_context(pki.ca, pki.client, tmp_path / "c"))[0] == 200
        Path(files.key_file).write_bytes(stranger.server.key_pem)  # the key arrives: the pair loads
        assert served.tls.reload_if_changed()


def test_a_missing_client_ca_serves_tls_to_anonymous_clients(pki: Pki, tmp_path: Path) -> None:
    files = server_files(pki, tmp_path / "srv")
    with serving(TlsFiles(files.cert_file, files.key_file)) as served:
        assert post_filter(served.port, client_context(pki.ca, None, tmp_path / "c"))[0] == 200


@pytest.mark.parametrize(("flags", "message"), [
    pytest.param(("cert", None, None), "go together", id="cert-without-key"),
    pytest.param((None, "key", None), "go together", id="key-without-cert"),
    pytest.param((None, None, "ca"), "needs --tls-cert-file", id="client-ca-alone"),
    pytest.param(("cert", "otherkey", None), "cannot load --tls-cert-file", id="key-of-another-certificate"),
    pytest.param(("cert", "key", "key"), "cannot load --client-ca-file", id="client-ca-not-a-certificate"),
])
def test_tls_flags_that_cannot_work_are_usage_errors(pki: Pki, stranger: Pki, tmp_path: Path,
                                                     flags: tuple[str | None, ...], message: str) -> None:
    cert, key = write(pki.server, tmp_path, "tls")
    _, other = write(stranger.server, tmp_path, "other")
    (tmp_path / "ca.crt").write_bytes(pki.ca.cert_pem)
    paths = {"cert": str(cert), "key": str(key), "otherkey": str(other), "ca": str(tmp_path / "ca.crt")}
    with pytest.raises(click.UsageError, match=message):
        tls_files(*(paths[f] if f else None for f in flags))


def test_an_unreadable_file_at_start_up_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TlsConfigError, match="cannot load --tls-cert-file"):
        ReloadingTls(TlsFiles(str(tmp_path / "missing.crt"), str(tmp_path / "missing.key")))
