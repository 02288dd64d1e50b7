"""The cluster's shared settings (gpupool/api/cluster_settings.py): the ConfigMap's keys, the node
annotation, the defaults the command line ships."""

from __future__ import annotations

import json

import pytest

from gpupool.api.agent_lease import DEFAULT_LEASE_NAMESPACE
from gpupool.api.cluster_settings import (
    AGENT_SETTINGS,
    DEFAULT_UNCONFIRMED_TIMEOUT_S,
    EXTENDER_RULES,
    ClusterSettings,
    ClusterSettingsError,
    Setting,
    from_config_data,
    read_published,
)
from gpupool.api.lending import DEFAULT_HIGH_PRIORITY_THRESHOLD
from gpupool.api.names import DEFAULT_DOMAIN, ResourceNames
from gpupool.core.policies import DEFAULT_POLICY


def test_the_defaults_are_the_shipped_command_line_defaults() -> None:
    settings = ClusterSettings()
    assert (settings.resource_domain, settings.gpushare_memory_unit, settings.high_priority_threshold,
            settings.hami, settings.agent_lease_namespace) == (
        DEFAULT_DOMAIN, "GiB", DEFAULT_HIGH_PRIORITY_THRESHOLD, False, DEFAULT_LEASE_NAMESPACE)
    assert (settings.policy, settings.require_agent_lease) == (DEFAULT_POLICY, False)
    assert settings.unconfirmed_timeout == DEFAULT_UNCONFIRMED_TIMEOUT_S == 300.0
    assert settings.resource_names() == ResourceNames()


@pytest.mark.parametrize(("setting", "flag"), [
    pytest.param(Setting.RESOURCE_DOMAIN, "--resource-domain", id="domain"),
    pytest.param(Setting.GPUSHARE_MEMORY_UNIT, "--gpushare-memory-unit", id="gpushare"),
    pytest.param(Setting.HIGH_PRIORITY_THRESHOLD, "--high-priority-threshold", id="threshold"),
    pytest.param(Setting.HAMI, "--hami/--no-hami", id="hami"),
    pytest.param(Setting.AGENT_LEASE_NAMESPACE, "--agent-lease-namespace", id="lease-namespace"),
    pytest.param(Setting.POLICY, "--policy", id="policy"),
    pytest.param(Setting.REQUIRE_AGENT_LEASE, "--require-agent-lease/--no-require-agent-lease", id="require-lease"),
    pytest.param(Setting.UNCONFIRMED_TIMEOUT, "--unconfirmed-timeout", id="unconfirmed-timeout"),
])
def test_each_setting_has_one_flag_name(setting: Setting, flag: str) -> None:
    assert setting.flag == flag
    assert hasattr(ClusterSettings(), setting.attribute)


def test_a_config_map_sets_each_value_from_text() -> None:
    settings = from_config_data({"resourceDomain": "gpu.example.com", "gpushareMemoryUnit": "MiB",
                                 "highPriorityThreshold": " 500 ", "hami": "True", "agentLeaseNamespace": ""})
    assert settings == ClusterSettings("gpu.example.com", "MiB", 500, True, "")
    assert settings.resource_names() == ResourceNames("gpu.example.com", hami=True, gpushare_unit_mib=1)


def test_a_config_map_sets_the_extenders_placement_rules() -> None:
    settings = from_config_data({"policy": " binpack ", "requireAgentLease": "TRUE"})
    assert (settings.policy, settings.require_agent_lease) == ("binpack", True)
    assert settings == ClusterSettings(policy="binpack", require_agent_lease=True)


@pytest.mark.parametrize(("text", "seconds"), [
    pytest.param("600", 600.0, id="whole"),
    pytest.param(" 90.5 ", 90.5, id="fraction"),
])
def test_a_config_map_sets_the_unconfirmed_timeout_in_seconds(text: str, seconds: float) -> None:
    settings = from_config_data({"unconfirmedTimeout": text})
    assert settings.unconfirmed_timeout == seconds
    assert settings == ClusterSettings(unconfirmed_timeout=seconds)


def test_keys_left_out_keep_their_defaults() -> None:
    assert from_config_data({"hami": "false"}) == ClusterSettings()
    assert from_config_data(None) == ClusterSettings()


@pytest.mark.parametrize(("data", "words"), [
    pytest.param({"resourceDomian": "x.io"}, "unknown key 'resourceDomian'", id="misspelt-key"),
    pytest.param({"gpushareMemoryUnit": "KiB"}, "gpushareMemoryUnit: expected one of GiB, MiB", id="unit"),
    pytest.param({"highPriorityThreshold": "high"}, "highPriorityThreshold: expected an integer", id="threshold"),
    pytest.param({"hami": "yes"}, "hami: expected true or false", id="hami"),
    pytest.param({"resourceDomain": "gpupool.io/x"}, "resource domain must be a DNS name", id="domain"),
    pytest.param({"agentLeaseNamespace": "Not_A_Namespace"}, "agentLeaseNamespace", id="namespace"),
    pytest.param({"policy": "tightest"}, "policy: unknown policy 'tightest'; the policies are ", id="policy"),
    pytest.param({"requireAgentLease": "on"}, "requireAgentLease: expected true or false, got 'on'",
                 id="require-lease"),
    pytest.param({"unconfirmedTimeout": "5m"}, "unconfirmedTimeout: expected seconds (a number such as \"300\"), "
                 "got '5m'", id="timeout-with-unit"),
    pytest.param({"unconfirmedTimeout": "0"}, "unconfirmedTimeout: expected seconds above 0, got 0.0",
                 id="timeout-zero"),
    pytest.param({"unconfirmedTimeout": "-30"}, "unconfirmedTimeout: expected seconds above 0", id="timeout-negative"),
    pytest.param({"unconfirmedTimeout": "inf"}, "unconfirmedTimeout: expected seconds above 0", id="timeout-infinite"),
    pytest.param({"unconfirmedTimeout": "nan"}, "unconfirmedTimeout: expected seconds above 0", id="timeout-nan"),
])
def test_a_bad_config_map_value_is_refused_naming_the_key_and_the_map(data: dict[str, str], words: str) -> None:
    with pytest.raises(ClusterSettingsError, match="ConfigMap gpupool-system/gpupool-cluster") as caught:
        from_config_data(data, "ConfigMap gpupool-system/gpupool-cluster")
    assert words in str(caught.value)


def test_overrides_replace_only_what_was_given() -> None:
    base = ClusterSettings(gpushare_memory_unit="MiB")
    assert base.overridden({Setting.HAMI: True, Setting.RESOURCE_DOMAIN: None}) == ClusterSettings(
        gpushare_memory_unit="MiB", hami=True)
    assert base.overridden({}) is base


def test_the_published_annotation_reads_back_every_setting_agents_read() -> None:
    settings = ClusterSettings("x.io", "MiB", 7, True, "leases", policy="spread", require_agent_lease=True)
    text = settings.published()
    assert json.loads(text)["v"] == 1
    assert read_published(text, "node n1") == {s: settings.value(s) for s in AGENT_SETTINGS}
    assert settings.published() == ClusterSettings("x.io", "MiB", 7, True, "leases").published()
    assert text == ClusterSettings("x.io", "MiB", 7, True, "leases").published()  # stable: no needless patch


def test_the_extenders_rules_are_not_the_agents() -> None:
    """No agent places a pod, and an agent sees a pod only once it is bound (when the unconfirmed
    timeout no longer applies): they neither publish the extender's rules nor are compared on them."""
    assert {s for s in Setting if not s.agents_read} == set(EXTENDER_RULES) == {
        Setting.POLICY, Setting.REQUIRE_AGENT_LEASE, Setting.UNCONFIRMED_TIMEOUT}
    text = ClusterSettings(policy="binpack", unconfirmed_timeout=60.0).published()
    assert text == ClusterSettings().published()
    assert read_published('{"v": 1, "policy": "binpack", "requireAgentLease": true, "unconfirmedTimeout": 60}',
                          "node n1") == {}


def test_an_agent_of_another_version_is_read_on_the_keys_both_know() -> None:
    assert read_published('{"v": 2, "hami": true, "futureSetting": 3}', "node n1") == {Setting.HAMI: True}


@pytest.mark.parametrize("text", [
    pytest.param("{broken", id="not-json"),
    pytest.param("[]", id="not-an-object"),
    pytest.param('{"highPriorityThreshold": true}', id="boolean-threshold"),
    pytest.param('{"hami": "true"}', id="string-hami"),
    pytest.param('{"resourceDomain": 5}', id="number-domain"),
])
def test_an_unreadable_annotation_is_refused(text: str) -> None:
    with pytest.raises(ClusterSettingsError, match="node n1"):
        read_published(text, "node n1")


def test_settings_made_from_resource_names_read_pods_with_them() -> None:
    names = ResourceNames("x.io", hami=True, gpushare_unit_mib=1)
    assert ClusterSettings.reading(names, 5).resource_names() == names
