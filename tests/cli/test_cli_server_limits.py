"""The connection caps and timeouts of ``gpupool extender`` and ``gpupool node-agent`` reach the servers
(docs/security.md, "Bounded servers")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpupool.cli import extender_cmd, node_agent_cmd
from gpupool.cli.main import cli
from gpupool.netguard.limits import ServerLimits
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.isolation.setup import IsolationConfig, build_enforcement
from gpupool.nodeagent.isolation.shim_backend import ShimEnforcement
from gpupool.nodeagent.isolation.shim_socket import RegistrationLimits
from gpupool.nodeagent.options import AgentOptions
from tests.cli.extender_start import started_with


def test_the_extender_serves_every_port_under_the_default_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    options = started_with(monkeypatch)
    assert extender_cmd._listeners(options).limits == ServerLimits()


def test_the_extender_limit_flags_reach_the_listeners(monkeypatch: pytest.MonkeyPatch) -> None:
    options = started_with(monkeypatch, "--max-connections", "64", "--handshake-timeout", "2",
                           "--header-timeout", "3", "--idle-timeout", "100")
    assert extender_cmd._listeners(options).limits == ServerLimits(64, 2.0, 3.0, 100.0)


@pytest.mark.parametrize("flags", [["--max-connections", "0"], ["--header-timeout", "0"],
                                   ["--handshake-timeout", "-1"], ["--idle-timeout", "0"]])
def test_limits_that_would_close_everything_are_refused(flags: list[str]) -> None:
    result = CliRunner().invoke(cli, ["extender", *flags])
    assert result.exit_code == 2, result.output


def test_the_node_agent_limit_flags_reach_its_metrics_port_and_registration_socket(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    async def fake_run(options: AgentOptions) -> None:
        seen["isolation"], seen["limits"] = options.isolation, options.server_limits

    monkeypatch.setattr(node_agent_cmd, "run_agent", fake_run)
    result = CliRunner().invoke(cli, ["node-agent", "--no-usage-monitor", "--max-connections", "32",
                                      "--header-timeout", "4", "--idle-timeout", "95",
                                      "--registration-timeout", "0.25", "--registration-max-connections", "40",
                                      "--registration-heartbeat", "7"])
    assert result.exit_code == 0, result.output
    assert seen["limits"] == ServerLimits(32, header_timeout_s=4.0, idle_timeout_s=95.0)
    assert seen["isolation"].registration == RegistrationLimits(0.25, 40, 7)


def test_the_registration_limits_reach_the_socket(tmp_path: Path) -> None:
    library = tmp_path / "lib.so"
    library.write_bytes(b"\x7fELF")
    config = IsolationConfig("shim", str(library), str(tmp_path / "s"), cgroup_root=str(tmp_path / "none"),
                             registration=RegistrationLimits(0.25, 40, 7))
    shim = build_enforcement(config, InMemoryContainerDirectory())
    assert isinstance(shim, ShimEnforcement)
    assert shim.server.read_timeout_s == 0.25 and shim.server.gate.max_connections == 40
    assert shim.registry.heartbeat_s == 7 and shim.registry.stale_after_s == 21.0
