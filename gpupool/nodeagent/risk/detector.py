"""Find risks in one look at the node: the monitor's holders against the grants (pure, no I/O).

Inputs are what the agent already keeps: the usage monitor's holders of each card's device file
(pid, start time, container), its last NVML sample (memory per process), the assignments of the
pods kubelet lists on this node (what each container was granted, card by card), whether an
isolation backend enforces the limits, and, where the interception library runs, which processes
registered and what each container's accounting region says. Only processes in a known pod
container are judged: a process in no container is the host's own (nvidia-persistenced, a DCGM
exporter, an admin's nvidia-smi), one whose container is not named yet is judged once it is, an
infrastructure holder (a pod that asked for no GPU in an infrastructure namespace: the GPU Operator's
DCGM exporter) is not judged at all, and an undecided one (a pod's process recorded before the pod
watch listed, where it could be infrastructure) only once the monitor has judged it.
A holder's card and registration are judged only after it has held the card for ``grace_s`` (a
library registers, a pod's names arrive through the watch, a fresh grant's annotation reaches the
cache); its memory (:mod:`~gpupool.nodeagent.risk.backstop`) at once, since a container with a
grant on the card has nothing to wait for and the driver's figures are facts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpupool.core.model import CardSlice
from gpupool.nodeagent.container_shares import ContainerName as ContainerName
from gpupool.nodeagent.container_shares import grants_of as grants_of
from gpupool.nodeagent.monitor.usage_sampling import UsageSample
from gpupool.nodeagent.monitor.usage_state import Holder, UsageState
from gpupool.nodeagent.risk.backstop import (
    DEFAULT_OVERHEAD_MIB,
    driver_figures,
    memory_by_pid,
    over_grant,
    region_tampered,
)
from gpupool.nodeagent.risk.findings import Risk, RiskKind

DEFAULT_GRACE_S = 10.0

Registered = Callable[[str, str, str], frozenset[int]]
"""(namespace, pod, container) → host pids registered with the interception library."""

Renewed = Callable[[str, str, str], Mapping[int, float]]
"""(namespace, pod, container) → host pid → when it last registered or renewed (the heartbeat)."""

RegionUse = Callable[[ContainerName], Mapping[int, int] | None]
"""(namespace, pod, container) → card → MiB its accounting region shows; ``None`` when unreadable."""


@dataclass(frozen=True)
class NodeView:
    """One look at the node, as the detector needs it."""

    cards: Mapping[str, int]
    """Card device path → card index."""
    state: UsageState
    sample: UsageSample | None
    grants: Mapping[ContainerName, Mapping[int, CardSlice]]
    enforcing: bool
    """Whether an isolation backend holds containers to their memory limits."""
    registered: Registered | None
    """Registered pids per container where the interception library runs; ``None`` elsewhere."""
    now: float
    overhead_mib: int = DEFAULT_OVERHEAD_MIB
    """Driver memory allowed per process on top of the grant (``--risk-memory-tolerance``)."""
    region: RegionUse | None = None
    """The containers' accounting regions where the interception library runs; ``None`` elsewhere."""
    renewed: Renewed | None = None
    """The registered processes' heartbeats where the interception library runs; ``None`` elsewhere."""
    stale_after_s: float = 30.0
    """A registered process not renewed for longer than this while it holds a card is stale."""


def detect(view: NodeView, grace_s: float = DEFAULT_GRACE_S) -> list[Risk]:
    """Every risk on the node now, ordered by card, then container, then pid."""
    risks: list[Risk] = []
    for path, card in sorted(view.cards.items(), key=lambda item: item[1]):
        device = view.state.device(path)
        if device is None:
            continue
        memory = memory_by_pid(view.sample, card, view.now)
        by_container: dict[ContainerName, list[Holder]] = {}
        for holder in device.users:  # infrastructure (nobody's) or undecided: no finding, its memory uncounted
            if holder.pod and holder.container:
                by_container.setdefault((holder.namespace, holder.pod, holder.container), []).append(holder)
        for name, named in sorted(by_container.items()):
            holders = [h for h in named if view.now - h.since >= grace_s]
            grant = view.grants.get(name, {}).get(card)
            if grant is None:
                risks += [_risk(RiskKind.UNGRANTED_CARD, card, h, "holds the card, and its container was granted "
                                "no share of it") for h in holders]
                continue
            risks += _memory_risks(view, name, card, grant, named, memory)
            if view.registered is not None and not grant.exclusive:
                known = view.registered(*name)
                risks += [_risk(RiskKind.UNREGISTERED_PROCESS, card, h, "holds a shared card without having "
                                "registered with the agent (the interception library did not run in it)")
                          for h in holders if h.pid not in known]
            risks += _stale_heartbeats(view, name, card, holders)
    return risks


def _stale_heartbeats(view: NodeView, name: ContainerName, card: int, holders: list[Holder]) -> list[Risk]:
    """Registered holders whose last renewal is older than the stale age (unregistered ones are the
    ``unregistered-process`` check's)."""
    if view.renewed is None:
        return []
    seen = view.renewed(*name)
    return [_risk(RiskKind.STALE_HEARTBEAT, card, h, f"registered but has not renewed for "
                  f"{view.now - seen[h.pid]:.0f} s (stale after {view.stale_after_s:g} s): the process is "
                  "stopped or frozen, or it registered without the interception library")
            for h in holders if h.pid in seen and view.now - seen[h.pid] > view.stale_after_s]


def _memory_risks(view: NodeView, name: ContainerName, card: int, grant: CardSlice, holders: list[Holder],
                  memory: Mapping[int, int]) -> list[Risk]:
    """The backstop for one container on one card: over its grant, or its region written down."""
    if not memory:
        return []
    risks = []
    driver = driver_figures(memory, (h.pid for h in holders))
    detail = over_grant(driver, grant.memory_mib, view.overhead_mib, view.enforcing)
    if detail is not None:
        risks.append(_risk(RiskKind.OVER_MEMORY, card, holders[0], detail, per_process=False))
    if view.region is None or view.registered is None:
        return risks
    known = view.registered(*name)
    registered = driver_figures(memory, (h.pid for h in holders if h.pid in known))
    if registered.used_mib <= view.overhead_mib * registered.processes:
        return risks  # nothing the region must show: no need to read it
    accounted = (view.region(name) or {}).get(card)
    detail = region_tampered(registered, accounted, view.overhead_mib) if accounted is not None else None
    if detail is not None:
        risks.append(_risk(RiskKind.REGION_TAMPERED, card, holders[0], detail, per_process=False))
    return risks


def _risk(kind: RiskKind, card: int, holder: Holder, detail: str, per_process: bool = True) -> Risk:
    return Risk(kind, card, holder.namespace, holder.pod, holder.container, holder.container_id,
                holder.pid if per_process else 0, holder.start_time if per_process else 0, detail)
