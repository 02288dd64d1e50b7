"""``gpupool node-agent`` runs the library's default agent: its flags' defaults are read from
``AgentOptions`` (issue 22), so ``AgentOptions(node)`` in tests and benchmarks is what users run."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace

import pytest
from click.testing import CliRunner

from gpupool.api.cluster_settings import ClusterSettings
from gpupool.cli import cluster_options, node_agent_cmd
from gpupool.cli.main import cli
from gpupool.nodeagent.dra.setup import DraOptions
from gpupool.nodeagent.lending.options import LendingOptions
from gpupool.nodeagent.options import AgentOptions


def started_with(monkeypatch: pytest.MonkeyPatch, *flags: str) -> AgentOptions:
    """The options ``gpupool node-agent --node-name n1 FLAGS`` would run with (no ConfigMap, no
    interception library installed)."""
    started: list[AgentOptions] = []

    async def run(options: AgentOptions) -> None:
        started.append(options)

    monkeypatch.setattr(node_agent_cmd, "run_agent", run)
    monkeypatch.setattr(node_agent_cmd, "packaged_library", lambda: None)
    monkeypatch.setattr(cluster_options, "read_with_client", lambda _kubeconfig: lambda _where: ClusterSettings())
    result = CliRunner().invoke(cli, ["node-agent", "--node-name", "n1", *flags])
    assert result.exit_code == 0, result.output
    (options,) = started
    return options


@pytest.mark.slow  # imports the CLI and probes the node
def test_the_cli_without_flags_runs_the_librarys_default_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    options = started_with(monkeypatch)
    assert options.start_checks  # the probes' verdicts, whatever this machine has
    assert replace(options, start_checks=()) == AgentOptions("n1")


@pytest.mark.slow
def test_lending_and_dra_on_take_their_options_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    options = started_with(monkeypatch, "--lending", "--dra")
    assert options.lending == replace(LendingOptions(), shim_state_dir=options.isolation.state_dir)
    assert options.dra == DraOptions()


@pytest.mark.slow
def test_infrastructure_holders_are_a_list_of_file_names_and_empty_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    options = started_with(monkeypatch, "--infrastructure-holders", " nvidia-persistenced , my-daemon ")
    assert options.monitor is not None and options.monitor.infrastructure == ("nvidia-persistenced", "my-daemon")
    options = started_with(monkeypatch, "--infrastructure-holders", "")
    assert options.monitor is not None and options.monitor.infrastructure == ()
    result = CliRunner().invoke(cli, ["node-agent", "--node-name", "n1", "--infrastructure-holders", "/usr/bin/x"])
    assert result.exit_code == 2 and "--infrastructure-holders" in result.output and "file name" in result.output


@pytest.mark.slow
def test_infrastructure_namespaces_are_none_by_default_and_a_list_of_namespace_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    options = started_with(monkeypatch)
    assert options.monitor is not None and options.monitor.infrastructure_namespaces == ()
    options = started_with(monkeypatch, "--infrastructure-namespaces", " gpu-operator , nvidia-dcgm ")
    assert options.monitor is not None and options.monitor.infrastructure_namespaces == ("gpu-operator", "nvidia-dcgm")
    result = CliRunner().invoke(cli, ["node-agent", "--node-name", "n1", "--infrastructure-namespaces", "GPU_Operator"])
    assert result.exit_code == 2 and "--infrastructure-namespaces" in result.output and "namespace" in result.output


@pytest.mark.slow
def test_sigterm_stops_the_agent_with_its_clean_ups_run_and_exit_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM cancels the agent (gpupool/nodeagent/termination.py): its parts' ``finally`` runs (the
    remote GPU server is stopped there) and the command exits 0, instead of the process dying with
    its programs left running."""
    cleaned: list[str] = []

    async def run(_options: AgentOptions) -> None:
        asyncio.get_running_loop().call_later(0.1, os.kill, os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(5)
            cleaned.append("ran on after SIGTERM")
        finally:
            cleaned.append("parts stopped")

    monkeypatch.setattr(node_agent_cmd, "run_agent", run)
    monkeypatch.setattr(node_agent_cmd, "packaged_library", lambda: None)
    monkeypatch.setattr(cluster_options, "read_with_client", lambda _kubeconfig: lambda _where: ClusterSettings())
    unhandled: list[int] = []  # without the agent's handler: recorded here, not pytest killed
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: unhandled.append(signum))
    try:
        result = CliRunner().invoke(cli, ["node-agent", "--node-name", "n1"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (result.exit_code, cleaned, unhandled) == (0, ["parts stopped"], []), result.output
