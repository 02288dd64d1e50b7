"""The shared settings on the command line: the ConfigMap's values, flags over them, the old
spellings (hidden, warning, still working), on ``gpupool extender`` and ``gpupool node-agent`` alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
import pytest
from click.testing import CliRunner

from gpupool.api.cluster_settings import AGENT_SETTINGS, ClusterSettings
from gpupool.api.names import NVIDIA_GPU
from gpupool.cli import cluster_options, node_agent_cmd
from gpupool.cli.main import cli
from gpupool.nodeagent.options import AgentOptions
from tests.cli.extender_start import started_with

MIB_CLUSTER = ClusterSettings(gpushare_memory_unit="MiB", high_priority_threshold=200, hami=True,
                              agent_lease_namespace="agents")


def test_the_extender_runs_with_the_config_maps_values(monkeypatch: pytest.MonkeyPatch) -> None:
    options = started_with(monkeypatch, config_map=MIB_CLUSTER)
    assert options.cluster == MIB_CLUSTER
    assert options.resource_names().gpushare_unit_mib == 1 and options.borrow.threshold == 200


def test_a_flag_overrides_the_config_map_for_its_setting_only(monkeypatch: pytest.MonkeyPatch) -> None:
    options = started_with(monkeypatch, "--gpushare-memory-unit", "GiB", "--no-hami", config_map=MIB_CLUSTER)
    assert options.cluster == ClusterSettings(high_priority_threshold=200, agent_lease_namespace="agents")


@pytest.mark.parametrize(("flags", "field", "value", "warning"), [
    pytest.param(["--domain", "x.io"], "resource_domain", "x.io", "--domain is deprecated", id="domain"),
    pytest.param(["--lease-namespace", "le"], "lease_namespace", "le", "use --leader-elect-resource-namespace",
                 id="leader-election-namespace"),
    pytest.param(["--lease-duration", "30"], "lease_duration", 30.0, "use --leader-elect-lease-duration",
                 id="leader-election-duration"),
])
def test_the_extenders_old_spellings_still_work_and_warn(monkeypatch: pytest.MonkeyPatch, flags: list[str],
                                                         field: str, value: Any, warning: str) -> None:
    started: list[Any] = []
    monkeypatch.setattr("gpupool.cli.extender_cmd.run_extender", started.append)
    result = CliRunner().invoke(cli, ["extender", *flags])
    assert result.exit_code == 0, result.output
    assert warning in result.output
    (options,) = started
    found = {"resource_domain": options.cluster.resource_domain, "lease_namespace": options.lease_namespace,
             "lease_duration": options.lease.lease_duration}
    assert found[field] == value


def test_new_and_old_spelling_that_disagree_are_refused() -> None:
    result = CliRunner().invoke(cli, ["extender", "--domain", "a.io", "--resource-domain", "b.io"])
    assert result.exit_code == 2 and "disagree" in result.output and "--resource-domain" in result.output


def test_old_spellings_are_hidden_from_help() -> None:
    for command in ("extender", "node-agent"):
        text = CliRunner().invoke(cli, [command, "--help"]).output
        assert "--resource-domain" in text and "--agent-lease-namespace" in text and "--cluster-config" in text
        assert "--domain " not in text and "--lease-namespace" not in text


def test_a_config_map_that_cannot_be_read_stops_the_extender_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreadable(_where: str) -> ClusterSettings:
        raise click.ClickException("ConfigMap gpupool-system/gpupool-cluster: hami: expected true or false, got 'x'")
    monkeypatch.setattr(cluster_options, "read_with_client", lambda _kubeconfig: unreadable)
    monkeypatch.setattr("gpupool.cli.extender_cmd.run_extender", lambda _options: None)
    result = CliRunner().invoke(cli, ["extender"])
    assert result.exit_code == 1 and "hami: expected true or false" in result.output


def test_no_config_map_is_read_when_told_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(_where: str) -> ClusterSettings:
        raise AssertionError("read")
    monkeypatch.setattr(cluster_options, "read_with_client", lambda _kubeconfig: never)
    started: list[Any] = []
    monkeypatch.setattr("gpupool.cli.extender_cmd.run_extender", started.append)
    result = CliRunner().invoke(cli, ["extender", "--cluster-config", ""])
    assert result.exit_code == 0, result.output
    assert started[0].cluster == ClusterSettings()


def agent_run(monkeypatch: pytest.MonkeyPatch, *flags: str,
              config_map: ClusterSettings | None = None) -> tuple[dict[str, Any], str]:
    """What ``gpupool node-agent FLAGS`` would run its loop with: aliases, heartbeat, names, cluster."""
    seen: dict[str, Any] = {}

    async def fake_run(options: AgentOptions) -> None:
        seen.update(names=options.names, aliases=options.aliases, heartbeat=options.heartbeat,
                    cluster=options.cluster)

    monkeypatch.setattr(node_agent_cmd, "run_agent", fake_run)
    monkeypatch.setattr(cluster_options, "read_with_client",
                        lambda _kubeconfig: lambda _where: config_map or ClusterSettings())
    result = CliRunner().invoke(cli, ["node-agent", "--no-usage-monitor", *flags])
    assert result.exit_code == 0, result.output
    return seen, result.output


def test_the_node_agent_runs_with_the_config_maps_values(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, _ = agent_run(monkeypatch, config_map=MIB_CLUSTER)
    assert seen["cluster"] == MIB_CLUSTER and seen["names"] == MIB_CLUSTER.resource_names()
    assert NVIDIA_GPU in seen["aliases"]  # hami: the agent serves HAMi's names
    assert seen["heartbeat"].namespace == "agents"


def _lease_namespace(seen: dict[str, Any]) -> bool:
    return bool(seen["heartbeat"].namespace == "old-ns" == seen["cluster"].agent_lease_namespace)


def _domain(seen: dict[str, Any]) -> bool:
    return bool(seen["cluster"].resource_domain == "x.io" == seen["names"].domain)


def _hami(seen: dict[str, Any]) -> bool:
    return bool(seen["cluster"].hami and NVIDIA_GPU in seen["aliases"])


def _renew_interval(seen: dict[str, Any]) -> bool:
    return bool(seen["heartbeat"].renew_interval_s == 5)


@pytest.mark.parametrize(("flags", "warning", "took"), [
    pytest.param(["--lease-namespace", "old-ns"], "use --agent-lease-namespace", _lease_namespace,
                 id="lease-namespace"),
    pytest.param(["--domain", "x.io"], "use --resource-domain", _domain, id="domain"),
    pytest.param(["--serve-aliases", "hami"], "use --hami", _hami, id="serve-aliases-hami"),
    pytest.param(["--lease-renew-interval", "5"], "use --agent-lease-renew-interval", _renew_interval,
                 id="renew-interval"),
])
def test_the_node_agents_old_spellings_still_work_and_warn(
        monkeypatch: pytest.MonkeyPatch, flags: list[str], warning: str,
        took: Callable[[dict[str, Any]], bool]) -> None:
    seen, output = agent_run(monkeypatch, *flags)
    assert warning in output and took(seen)


def test_serve_aliases_hami_with_no_hami_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(cli, ["node-agent", "--no-usage-monitor", "--serve-aliases", "hami", "--no-hami"])
    assert result.exit_code == 2 and "disagree" in result.output


def test_an_override_that_differs_from_the_config_map_is_logged(monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="gpupool.cli.cluster_options"):
        started_with(monkeypatch, "--gpushare-memory-unit", "GiB", "--high-priority-threshold", "200",
                     config_map=MIB_CLUSTER)
    (record,) = caplog.records  # the threshold agrees with the ConfigMap: not a word about it
    assert record.getMessage().startswith("--gpushare-memory-unit GiB overrides the cluster's gpushareMemoryUnit MiB "
                                          "(ConfigMap gpupool-system/gpupool-cluster)")


BINPACK_STRICT = ClusterSettings(policy="binpack", require_agent_lease=True)


def test_the_extender_takes_its_placement_rules_from_the_config_map(monkeypatch: pytest.MonkeyPatch) -> None:
    options = started_with(monkeypatch, config_map=BINPACK_STRICT)
    assert (options.policy, options.require_agent_lease) == ("binpack", True)


def test_the_extenders_placement_flags_override_the_config_map(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO"):
        options = started_with(monkeypatch, "--policy", "spread", "--no-require-agent-lease",
                               config_map=BINPACK_STRICT)
    assert (options.policy, options.require_agent_lease) == ("spread", False)
    assert options.cluster == ClusterSettings(policy="spread")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(w.startswith("--policy spread overrides the cluster's policy binpack (ConfigMap "
                            "gpupool-system/gpupool-cluster): kubectl gpupool why explains with the ConfigMap's")
               for w in warnings), warnings
    assert any(w.startswith("--require-agent-lease/--no-require-agent-lease False overrides the cluster's "
                            "requireAgentLease True") for w in warnings), warnings
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cluster settings: ")]
    assert "policy=spread (flag)" in line and "requireAgentLease=False (flag)" in line


def test_a_bad_placement_rule_in_the_config_map_stops_the_extender(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader's own words (from_config_data through read_cluster_settings) reach the user."""
    from gpupool.api.cluster_settings import ClusterSettingsError, from_config_data

    def bad(where: str) -> ClusterSettings:
        try:
            return from_config_data({"policy": "tightest"}, f"ConfigMap {where}")
        except ClusterSettingsError as exc:
            raise click.ClickException(str(exc)) from None
    monkeypatch.setattr(cluster_options, "read_with_client", lambda _kubeconfig: bad)
    monkeypatch.setattr("gpupool.cli.extender_cmd.run_extender", lambda _options: None)
    result = CliRunner().invoke(cli, ["extender"])
    assert result.exit_code == 1
    assert "ConfigMap gpupool-system/gpupool-cluster: policy: unknown policy 'tightest'" in result.output


def test_the_node_agent_has_no_placement_flags_and_does_not_log_them(monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(cli, ["node-agent", "--help"])
    assert "--policy" not in result.output and "--require-agent-lease" not in result.output
    flags = cluster_options.ClusterFlags(overrides={s: None for s in AGENT_SETTINGS})
    line = cluster_options.describe(BINPACK_STRICT, flags)
    assert "policy" not in line and "requireAgentLease" not in line and "hami=False" in line


PATIENT = ClusterSettings(unconfirmed_timeout=600.0)
"""A cluster whose ConfigMap lets an unbound assignment hold its cards for 10 minutes."""


def test_the_extender_books_by_the_config_maps_unconfirmed_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timeout the extender's cache expires unbound assignments by (start_replica hands the
    cache ``unconfirmed_timeout_s``) is the ConfigMap's, which kubectl gpupool reads too."""
    options = started_with(monkeypatch, config_map=PATIENT)
    assert options.unconfirmed_timeout_s == 600.0 and options.cluster == PATIENT
    assert started_with(monkeypatch).unconfirmed_timeout_s == 300.0


def test_the_unconfirmed_timeout_flag_overrides_the_config_map_with_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO"):
        options = started_with(monkeypatch, "--unconfirmed-timeout", "120", config_map=PATIENT)
    assert options.unconfirmed_timeout_s == 120.0 and options.cluster == ClusterSettings(unconfirmed_timeout=120.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["--unconfirmed-timeout 120.0 overrides the cluster's unconfirmedTimeout 600.0 (ConfigMap "
                        "gpupool-system/gpupool-cluster): kubectl gpupool inspect and why count unbound assignments "
                        "by the ConfigMap's value, and an extender replica without this flag books them otherwise "
                        "once it leads (docs/cluster-config.md)"]
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cluster settings: ")]
    assert line.endswith("unconfirmedTimeout=120.0 (flag)")


@pytest.mark.parametrize("value", ["0", "-5", "inf", "soon"])
def test_a_bad_unconfirmed_timeout_flag_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setattr("gpupool.cli.extender_cmd.run_extender", lambda _options: None)
    result = CliRunner().invoke(cli, ["extender", "--cluster-config", "", "--unconfirmed-timeout", value])
    assert result.exit_code == 2 and "--unconfirmed-timeout" in result.output


def test_a_bad_unconfirmed_timeout_in_the_config_map_stops_the_extender(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.api.cluster_settings import ClusterSettingsError, from_config_data

    def bad(where: str) -> ClusterSettings:
        try:
            return from_config_data({"unconfirmedTimeout": "5m"}, f"ConfigMap {where}")
        except ClusterSettingsError as exc:
            raise click.ClickException(str(exc)) from None
    monkeypatch.setattr(cluster_options, "read_with_client", lambda _kubeconfig: bad)
    monkeypatch.setattr("gpupool.cli.extender_cmd.run_extender", lambda _options: None)
    result = CliRunner().invoke(cli, ["extender"])
    assert result.exit_code == 1
    assert "ConfigMap gpupool-system/gpupool-cluster: unconfirmedTimeout: expected seconds" in result.output


def test_the_node_agent_has_no_unconfirmed_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent sees a pod once it is bound, when the timeout no longer applies: no flag, not logged."""
    assert "--unconfirmed-timeout" not in CliRunner().invoke(cli, ["node-agent", "--help"]).output
    flags = cluster_options.ClusterFlags(overrides={s: None for s in AGENT_SETTINGS})
    assert "unconfirmedTimeout" not in cluster_options.describe(PATIENT, flags)
    seen, _ = agent_run(monkeypatch, config_map=PATIENT)
    assert seen["cluster"] == PATIENT
