"""Builders for the risk tests: pods with grants, holders, samples, a node view."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.nodeagent.monitor.usage_sampling import CardUsage, ProcessUsage, UsageSample
from gpupool.nodeagent.monitor.usage_state import DeviceState, DeviceUsage, Holder, UsageState
from gpupool.nodeagent.risk.backstop import DEFAULT_OVERHEAD_MIB
from gpupool.nodeagent.risk.detector import NodeView, RegionUse, Registered, grants_of
from gpupool.nodeagent.types import NodeAssignment, PodView

NODE = "n1"
NOW = 1_000.0
OLD = NOW - 60.0
CARDS = {"/dev/nvidia0": 0, "/dev/nvidia1": 1}


def pod(name: str, grants: Mapping[str, tuple[CardSlice, ...]] | None, namespace: str = "team") -> PodView:
    """A running pod on NODE; ``grants`` container → slices (``None``: a pod without GPUs)."""
    assignment = None
    if grants is not None:
        placement = Placement(f"{namespace}/{name}", NODE, 0, 0,
                              tuple(ContainerAssignment(c, slices) for c, slices in grants.items()))
        assignment = NodeAssignment(placement, {})
    return PodView(namespace, name, f"uid-{name}", NODE, 0.0, False, (), assignment)


def holder(pid: int, pod_name: str = "", container: str = "", since: float = OLD, namespace: str = "team") -> Holder:
    """A process holding a card; no pod name: a host process."""
    return Holder(pid=pid, start_time=pid * 10, since=since, container_id=f"cid-{pod_name}-{container}" if pod_name
                  else "", container=container, pod=pod_name, namespace=namespace if pod_name else "")


def state(holders: Mapping[int, tuple[Holder, ...]]) -> UsageState:
    """The usage state with these holders per card index."""
    by_index = {index: path for path, index in CARDS.items()}
    return UsageState(NODE, NOW, tuple(
        DeviceUsage(by_index[i], holders.get(i, ()), OLD, DeviceState.BUSY if holders.get(i) else DeviceState.FREE)
        for i in sorted(by_index)))


def sample(memory: Mapping[int, Mapping[int, int]]) -> UsageSample:
    """card → pid → MiB used."""
    return UsageSample(NOW, tuple(CardUsage(card, 50, sum(pids.values()), 15360,
                                            tuple(ProcessUsage(pid, mib) for pid, mib in pids.items()))
                                  for card, pids in memory.items()))


def view(pods: list[PodView], holders: Mapping[int, tuple[Holder, ...]], *, enforcing: bool = True,
         memory: Mapping[int, Mapping[int, int]] | None = None, registered: Registered | None = None,
         overhead_mib: int = DEFAULT_OVERHEAD_MIB, region: RegionUse | None = None,
         sampled_at: float = NOW) -> NodeView:
    taken = replace(sample(memory or {}), time=sampled_at)
    return NodeView(CARDS, state(holders), taken, grants_of(NODE, pods), enforcing, registered, NOW,
                    overhead_mib=overhead_mib, region=region)
