"""A node agent's published settings against ours, and the words for a mismatch
(gpupool/api/settings_check.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpupool.api.cluster_settings import AGENT_SETTINGS_ANNOTATION, ClusterSettings, Setting
from gpupool.api.settings_check import Difference, differences, settings_problem

OURS = ClusterSettings()


def published(**changes: Any) -> dict[str, str]:
    return {AGENT_SETTINGS_ANNOTATION: dataclasses.replace(OURS, **changes).published()}


def test_agreeing_settings_and_an_unannotated_node_are_no_problem() -> None:
    assert settings_problem("n1", published(), OURS) is None
    assert settings_problem("n1", {}, OURS) is None  # no agent yet, or an agent older than the annotation


@pytest.mark.parametrize(("changes", "says", "fix"), [
    pytest.param({"gpushare_memory_unit": "MiB"},
                 "node n1 counts gpushare memory (aliyun.com/gpu-mem) in MiB, the extender in GiB",
                 "Set gpushareMemoryUnit once in ConfigMap gpupool-system/gpupool-cluster, drop --gpushare-memory-unit",
                 id="gpushare-unit"),
    pytest.param({"resource_domain": "other.io"},
                 "node n1's agent names resources other.io/gpu-mem..., the extender gpupool.io/gpu-mem...",
                 "Set resourceDomain once", id="domain"),
    pytest.param({"high_priority_threshold": 500},
                 "node n1 takes pods from priority 500 as high priority (never borrowers), the extender from 1000",
                 "drop --high-priority-threshold", id="threshold"),
    pytest.param({"hami": True}, "node n1's agent reads nvidia.com/gpu as HAMi's card count, the extender does not",
                 "drop --hami/--no-hami", id="hami"),
    pytest.param({"agent_lease_namespace": "elsewhere"},
                 "renews its heartbeat Lease in namespace elsewhere, the extender watches gpupool-node-lease",
                 "Set agentLeaseNamespace once", id="lease-namespace"),
])
def test_each_mismatch_names_both_values_and_the_fix(changes: dict[str, object], says: str, fix: str) -> None:
    reason = settings_problem("n1", published(**changes), OURS)
    assert reason is not None and says in reason and fix in reason
    assert "docs/cluster-config.md" in reason


def test_several_mismatches_are_all_named_in_setting_order() -> None:
    found = differences({Setting.HAMI: True, Setting.GPUSHARE_MEMORY_UNIT: "MiB",
                         Setting.RESOURCE_DOMAIN: "gpupool.io"}, OURS)
    assert found == (Difference(Setting.GPUSHARE_MEMORY_UNIT, "MiB", "GiB"), Difference(Setting.HAMI, True, False))
    reason = settings_problem("n1", published(gpushare_memory_unit="MiB", hami=True), OURS)
    assert reason is not None and "gpushareMemoryUnit, hami" in reason


def test_the_speaker_and_the_config_map_are_named_as_given() -> None:
    reason = settings_problem("n1", published(hami=True), OURS, we="the cluster configuration",
                              config_map="gpupool/settings")
    assert reason is not None and "the cluster configuration does not" in reason
    assert "ConfigMap gpupool/settings" in reason


def test_an_unreadable_annotation_is_a_problem_naming_it() -> None:
    reason = settings_problem("n1", {AGENT_SETTINGS_ANNOTATION: "{oops"}, OURS)
    assert reason is not None and AGENT_SETTINGS_ANNOTATION in reason and "unknown" in reason


def test_no_heartbeat_on_either_side_is_not_a_lease_namespace_mismatch() -> None:
    """An agent started without a heartbeat, or an extender that watches none, is left to the
    liveness check; only two different namespaces are refused."""
    assert settings_problem("n1", published(agent_lease_namespace=""), OURS) is None
    assert settings_problem("n1", published(), dataclasses.replace(OURS, agent_lease_namespace="")) is None
    assert settings_problem("n1", published(agent_lease_namespace="a"), OURS) is not None
