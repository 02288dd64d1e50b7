"""The TLS, health-port and liveness flags of ``gpupool extender`` and ``gpupool node-agent``."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli import extender_cmd
from gpupool.cli.main import cli
from gpupool.extender.http.tls import TlsFiles
from tests.cli.extender_start import started_with
from tests.extender.tls_world import Pki, server_files


def test_without_tls_flags_the_extender_serves_plain_http_and_no_health_port(monkeypatch: pytest.MonkeyPatch) -> None:
    options = started_with(monkeypatch)
    assert options.tls is None and options.cluster.agent_lease_namespace == "gpupool-node-lease"
    assert not options.require_agent_lease
    listeners = extender_cmd._listeners(options)
    assert listeners.tls is None and listeners.health_port is None


def test_tls_flags_reach_the_listeners_with_a_health_port(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    files = server_files(Pki.make(), tmp_path)
    options = started_with(monkeypatch, "--tls-cert-file", files.cert_file, "--tls-private-key-file",
                           files.key_file, "--client-ca-file", str(files.client_ca_file),
                           "--require-agent-lease", "--agent-lease-namespace", "gpupool")
    assert options.tls == TlsFiles(files.cert_file, files.key_file, files.client_ca_file)
    assert options.require_agent_lease and options.cluster.agent_lease_namespace == "gpupool"
    listeners = extender_cmd._listeners(options)
    assert listeners.tls is not None and listeners.health_port == 8889
    assert extender_cmd._listeners(extender_cmd.ExtenderOptions(tls=files, health_port=0)).health_port is None


def test_a_key_without_its_certificate_stops_the_extender(tmp_path: Path) -> None:
    key = tmp_path / "tls.key"
    key.write_text("x")
    result = CliRunner().invoke(cli, ["extender", "--tls-private-key-file", str(key)])
    assert result.exit_code == 2 and "go together" in result.output


@pytest.mark.parametrize(("flags", "hint"), [
    pytest.param(["--agent-lease-duration", "10", "--agent-lease-renew-interval", "10"], "must be shorter",
                 id="interval-too-long"),
    pytest.param(["--agent-lease-duration", "0"], "--agent-lease-duration", id="zero-duration"),
    pytest.param(["--agent-lease-renew-interval", "0"], "--agent-lease-renew-interval", id="zero-interval"),
    pytest.param(["--lease-duration", "10", "--lease-renew-interval", "10"], "must be shorter",
                 id="old-spellings-interval-too-long"),
    pytest.param(["--lease-duration", "0"], "--lease-duration", id="old-spelling-zero-duration"),
])
def test_node_agent_lease_timings_that_would_lapse_are_refused(flags: list[str], hint: str) -> None:
    result = CliRunner().invoke(cli, ["node-agent", *flags])
    assert result.exit_code == 2 and hint in result.output, result.output
