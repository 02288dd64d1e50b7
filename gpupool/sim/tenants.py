"""Replaying a trace with tenants and GPU quotas: who got how much, and who was refused why.

Tenants are drawn from the trace's QoS class (``LS``, ``BE``, ...): a pod of class ``LS`` is the
pod ``LS/<name>`` of tenant ``LS``, as a pod of namespace ``LS`` is in the cluster. Each arrival is
decided the way the extender decides it, with the same core functions:

1. the GPU models on which a quota of its tenant has no room left for it are closed to it
   (:func:`gpupool.core.quota.refused_models`, the filter's estimate); when every model is closed
   it is refused by quota;
2. the scheduler places it on the cards left (:meth:`Scheduler.decide`);
3. the exact placement is checked against the quotas with the usage the ledger holds
   (:func:`gpupool.core.quota.quota_verdict`, the bind's check) and only then booked.

Departures free what a pod held; the tenant's usage is the ledger's own tally.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.card_scope import CardScope
from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.groups import scoped
from gpupool.core.model import NodeSpec, Placement, PodRequest
from gpupool.core.policies import make_policy
from gpupool.core.quota import ModelSizes, Quota, quota_verdict, refused_models
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from gpupool.core.usage import placement_use, total
from gpupool.sim.trace import TracePod

NO_CLASS = "none"
"""The tenant of pods whose QoS class the trace leaves empty."""


@dataclass
class TenantReport:
    """One tenant's replay: pods that arrived, were placed, were refused by a quota (and the first
    such reason) or for lack of room, and its GPU compute held (per-mille of a card)."""

    tenant: str
    arrived: int = 0
    placed: int = 0
    refused_by_quota: int = 0
    refused_no_room: int = 0
    peak_compute: int = 0
    compute_sum: int = 0
    samples: int = 0
    first_quota_reason: str = ""

    @property
    def mean_compute(self) -> float:
        return self.compute_sum / self.samples if self.samples else 0.0

    def to_json(self) -> dict[str, object]:
        return {"tenant": self.tenant, "arrived": self.arrived, "placed": self.placed,
                "refused_by_quota": self.refused_by_quota, "refused_no_room": self.refused_no_room,
                "peak_gpus": round(self.peak_compute / 1000, 2), "mean_gpus": round(self.mean_compute / 1000, 2),
                "first_quota_reason": self.first_quota_reason}


def tenant_of_pod(pod: TracePod) -> str:
    return pod.qos or NO_CLASS


def with_tenant(pod: TracePod) -> PodRequest:
    """The pod's request keyed ``<tenant>/<name>`` (the ledger counts usage by that prefix)."""
    return dataclasses.replace(pod.request, key=f"{tenant_of_pod(pod)}/{pod.request.key}")


def decide_with_quotas(scheduler: Scheduler, sizes: ModelSizes, request: PodRequest,
                       quotas: Sequence[Quota]) -> Placement | str:
    """The extender's decision for one pod under its tenant's quotas: a placement (not booked) or
    the reason it is refused: a quota's sentence (also when the models a quota left open had no
    room), or ``"no room"``."""
    state = scheduler.state
    tenant = request.key.partition("/")[0]
    refused: dict[str, str] = {}
    if quotas and request.wants_gpu:
        refused = refused_models(quotas, state.usage.of(tenant), request, sizes.of(state))
        if refused and set(refused) >= set(sizes.of(state)):
            return sorted(refused.values())[0]
        if refused:
            request = scoped(request, CardScope("GPU models the quota leaves room on",
                                                avoid_models=frozenset(refused)))
    decision = scheduler.decide(request)
    if not isinstance(decision, Placement):
        return sorted(refused.values())[0] if refused else "no room"
    if quotas:
        spec = state.specs[state.index[decision.node]]
        reason = quota_verdict(quotas, state.usage.of(tenant), placement_use(decision, spec))
        if reason is not None:
            return reason
    return decision


def replay_tenants(nodes: Sequence[NodeSpec], pods: Sequence[TracePod], policy_name: str,
                   quotas: Mapping[str, Sequence[Quota]], samples: int = 200,
                   seed: int = 42) -> dict[str, TenantReport]:
    """Arrivals and departures in time order (departures first at equal times), each arrival decided
    by :func:`decide_with_quotas`; per tenant, what it got and why it was refused."""
    state = ClusterState(nodes)
    rng = np.random.default_rng(seed)
    scheduler = Scheduler(state, make_policy(policy_name, rng),
                          profile=WorkloadProfile.from_pods([p.request for p in pods]),
                          tie_rank=rng.permutation(state.size).astype(np.int64), rng=rng)
    sizes = ModelSizes()
    reports = {t: TenantReport(t) for t in sorted({tenant_of_pod(p) for p in pods})}
    events = [(p.creation_time, 1, i) for i, p in enumerate(pods)]
    heapq.heapify(events)
    start = min(p.creation_time for p in pods)
    end = max(max(p.creation_time, p.deletion_time or p.creation_time) for p in pods)
    step, next_sample = max(1, (end - start) // max(samples, 1)), start
    while events:
        time, kind, position = heapq.heappop(events)
        while time >= next_sample:
            _sample(state, reports)
            next_sample += step
        pod = pods[position]
        request = with_tenant(pod)
        if kind == 0:
            state.release(request.key)
            continue
        report = reports[tenant_of_pod(pod)]
        report.arrived += 1
        decision = decide_with_quotas(scheduler, sizes, request, quotas.get(report.tenant, ()))
        if isinstance(decision, Placement):
            state.apply(decision)
            report.placed += 1
            if pod.deletion_time is not None:
                heapq.heappush(events, (max(pod.deletion_time, time), 0, position))
        elif decision == "no room":
            report.refused_no_room += 1
        else:
            report.refused_by_quota += 1
            report.first_quota_reason = report.first_quota_reason or decision
    _sample(state, reports)
    return reports


def _sample(state: ClusterState, reports: Mapping[str, TenantReport]) -> None:
    for tenant, report in reports.items():
        held = total(state.usage.of(tenant)).compute
        report.peak_compute = max(report.peak_compute, held)
        report.compute_sum += held
        report.samples += 1
