"""Find risks in one look at the node: the monitor's holders against the grants (pure, no I/O).

Inputs are what the agent already keeps: the usage monitor's holders of each card's device file
(pid, start time, container), its last NVML sample (memory per process), the assignments of the
pods kubelet lists on this node (what each container was granted, card by card), whether an
isolation backend enforces the limits, and, where the interception library runs, which processes
registered. A holder is judged only after it has held the card for ``grace_s`` (a library
registers, a pod's names arrive through the watch, a fresh grant's annotation reaches the cache),
and only when it runs in a known pod container: a process in no container is the host's own
(nvidia-persistenced, a DCGM exporter, an admin's nvidia-smi), and one whose container is not named
yet is judged once it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpupool.core.model import CardSlice
from gpupool.nodeagent.monitor.usage_sampling import UsageSample
from gpupool.nodeagent.monitor.usage_state import Holder, UsageState
from gpupool.nodeagent.risk.findings import Risk, RiskKind
from gpupool.nodeagent.types import PodView

DEFAULT_GRACE_S = 10.0

ContainerName = tuple[str, str, str]
"""(namespace, pod, container)."""

Registered = Callable[[str, str, str], frozenset[int]]
"""(namespace, pod, container) → host pids registered with the interception library."""


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


def grants_of(node: str, pods: Iterable[PodView]) -> dict[ContainerName, dict[int, CardSlice]]:
    """What each container of the running pods placed on this node holds, per card."""
    grants: dict[ContainerName, dict[int, CardSlice]] = {}
    for pod in pods:
        if pod.terminated or pod.assignment is None or pod.assignment.placement.node not in ("", node):
            continue
        for assignment in pod.assignment.placement.containers:
            slices = grants.setdefault((pod.namespace, pod.name, assignment.container), {})
            for piece in assignment.slices:
                slices[piece.card] = piece
    return grants


def detect(view: NodeView, grace_s: float = DEFAULT_GRACE_S) -> list[Risk]:
    """Every risk on the node now, ordered by card, then container, then pid."""
    risks: list[Risk] = []
    for path, card in sorted(view.cards.items(), key=lambda item: item[1]):
        device = view.state.device(path)
        if device is None:
            continue
        judged = [h for h in device.holders if h.pod and h.container and view.now - h.since >= grace_s]
        memory = _memory_by_pid(view.sample, card)
        by_container: dict[ContainerName, list[Holder]] = {}
        for holder in judged:
            by_container.setdefault((holder.namespace, holder.pod, holder.container), []).append(holder)
        for name, holders in sorted(by_container.items()):
            grant = view.grants.get(name, {}).get(card)
            if grant is None:
                risks += [_risk(RiskKind.UNGRANTED_CARD, card, h, "holds the card, and its container was granted "
                                "no share of it") for h in holders]
                continue
            if not view.enforcing:
                used = sum(memory.get(h.pid, 0) for h in holders)
                if used > grant.memory_mib:
                    risks.append(_risk(RiskKind.OVER_MEMORY, card, holders[0], f"use {used} MiB, above the "
                                       f"grant's {grant.memory_mib} MiB, and no isolation backend enforces it",
                                       per_process=False))
            if view.registered is not None and not grant.exclusive:
                known = view.registered(*name)
                risks += [_risk(RiskKind.UNREGISTERED_PROCESS, card, h, "holds a shared card without having "
                                "registered with the agent (the interception library did not run in it)")
                          for h in holders if h.pid not in known]
    return risks


def _memory_by_pid(sample: UsageSample | None, card: int) -> dict[int, int]:
    sampled = sample.card(card) if sample is not None else None
    return {p.pid: p.memory_used_mib for p in sampled.processes} if sampled is not None else {}


def _risk(kind: RiskKind, card: int, holder: Holder, detail: str, per_process: bool = True) -> Risk:
    return Risk(kind, card, holder.namespace, holder.pod, holder.container, holder.container_id,
                holder.pid if per_process else 0, holder.start_time if per_process else 0, detail)
