"""Does a node's agent run with the cluster's settings? The comparison and the words for a mismatch.

The extender refuses GPU pods on a node whose agent published other values than its own
(:mod:`gpupool.extender.cache`), and ``kubectl gpupool`` shows the same reason, both from
:func:`settings_problem`: the check and its explanation are one function, so they cannot disagree.
A node without the annotation (no agent yet, or an agent older than the annotation) is not checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpupool.api.cluster_settings import (
    AGENT_SETTINGS,
    AGENT_SETTINGS_ANNOTATION,
    CONFIG_MAP,
    ClusterSettings,
    ClusterSettingsError,
    Setting,
    Value,
    read_published,
)
from gpupool.api.names import ALIYUN_GPU_MEM, NVIDIA_GPU

EXTENDER = "the extender"


@dataclass(frozen=True)
class Difference:
    """One setting the node's agent and this component read differently."""

    setting: Setting
    node_value: Value
    our_value: Value

    def says(self, node: str, we: str) -> str:
        """The difference in words, naming both values (``we``: "the extender", ...)."""
        mine, theirs = self.our_value, self.node_value
        match self.setting:
            case Setting.RESOURCE_DOMAIN:
                return f"node {node}'s agent names resources {theirs}/gpu-mem..., {we} {mine}/gpu-mem..."
            case Setting.GPUSHARE_MEMORY_UNIT:
                return f"node {node} counts gpushare memory ({ALIYUN_GPU_MEM}) in {theirs}, {we} in {mine}"
            case Setting.HIGH_PRIORITY_THRESHOLD:
                return (f"node {node} takes pods from priority {theirs} as high priority (never borrowers), "
                        f"{we} from {mine}")
            case Setting.HAMI:
                serves = "reads" if theirs else "does not read"
                return (f"node {node}'s agent {serves} {NVIDIA_GPU} as HAMi's card count, {we} "
                        f"{'does' if mine else 'does not'}")
            case Setting.AGENT_LEASE_NAMESPACE:
                return (f"node {node}'s agent renews its heartbeat Lease in namespace {theirs or '(none)'}, "
                        f"{we} watches {mine or '(none)'}")
            case _:  # the extender's rules: agents neither publish nor are compared on them
                return f"node {node}'s agent runs with {self.setting} {theirs}, {we} with {mine}"


def differences(published: Mapping[Setting, Value], ours: ClusterSettings) -> tuple[Difference, ...]:
    """The settings whose published value differs from ours, in :class:`Setting` order.

    An agent that renews no heartbeat Lease, or an extender that watches none (an empty Lease
    namespace), is not a Lease-namespace mismatch: that node simply has no heartbeat, which the
    liveness check judges (``--require-agent-lease``). Two different namespaces are: the extender
    would never see the agent's Lease.
    """
    return tuple(Difference(s, published[s], ours.value(s)) for s in AGENT_SETTINGS
                 if s in published and published[s] != ours.value(s)
                 and not (s is Setting.AGENT_LEASE_NAMESPACE and "" in (published[s], ours.value(s))))


def mismatch_reason(node: str, found: tuple[Difference, ...], *, we: str = EXTENDER,
                    config_map: str = CONFIG_MAP) -> str:
    """Why a node gets no GPU pods, each difference with both values and how to make them agree."""
    said = "; ".join(d.says(node, we) for d in found)
    keys = ", ".join(d.setting.value for d in found)
    flags = ", ".join(d.setting.flag for d in found)
    return (f"gpupool settings differ: {said}. Set {keys} once in ConfigMap {config_map}, drop {flags} "
            f"where it overrides it, and restart the component that differs (docs/cluster-config.md)")


def settings_problem(node: str, annotations: Mapping[str, str], ours: ClusterSettings, *,
                     we: str = EXTENDER, config_map: str = CONFIG_MAP) -> str | None:
    """Why ``node`` may take no GPU pod by its agent's published settings; ``None`` when they agree
    (or it published none). An unreadable annotation is a problem too: what the node runs with is
    then unknown."""
    text = annotations.get(AGENT_SETTINGS_ANNOTATION)
    if text is None:
        return None
    try:
        published = read_published(text, f"node {node}")
    except ClusterSettingsError as exc:
        return f"{exc}: what its agent runs with is unknown, so gpupool places no GPU pod there"
    found = differences(published, ours)
    return mismatch_reason(node, found, we=we, config_map=config_map) if found else None
