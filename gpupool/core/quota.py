"""GPU quotas: what a tenant may still take is its limit minus what the ledger says it holds.

The rules (seed 002's per-requester upper limit, seed 004's per-namespace quota by GPU model):

* a :class:`Quota` limits a tenant (a namespace) overall and per GPU model, in three dimensions:
  memory (MiB), compute (per-mille of a card; a whole card counts its full compute) and whole
  cards (cards held exclusively). A dimension without a limit is not limited;
* a request is refused when, in some dimension it asks for, what the tenant holds plus what it asks
  would pass a limit. What it already holds beyond a limit (a limit lowered later) refuses only new
  requests that ask for more of that dimension;
* every quota of the tenant applies (as Kubernetes applies every ResourceQuota of a namespace).

:func:`quota_verdict` is the whole rule as one pure function of (quotas, used, asked), so the
extender's bind (which checks the exact placement under the ledger's lock, see
:mod:`gpupool.extender.booking_keeper`), its filter (which estimates per GPU model, see
:func:`refused_models`), the simulator and an admission webhook all decide with the same code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from gpupool.core.model import GpuRequest, PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.core.usage import NOTHING, Amounts, ModelUse, total


@dataclass(frozen=True)
class Limits:
    """Upper limits in the three dimensions; None = not limited."""

    memory_mib: int | None = None
    compute: int | None = None
    cards: int | None = None


@dataclass(frozen=True)
class Quota:
    """The limits of one tenant from one quota object.

    ``name`` names the object in reasons (``namespace/name``); ``per_model`` pairs GPU models with
    their limits (a tuple so that a quota is hashable); ``pools`` are the node pools (values of the
    pool label) the tenant may use, empty = every pool.
    """

    name: str
    tenant: str
    hard: Limits = Limits()
    per_model: tuple[tuple[str, Limits], ...] = ()
    pools: frozenset[str] = frozenset()


def _over(quota: str, model: str, limits: Limits, used: Amounts, asked: Amounts) -> str | None:
    """Which limit of ``limits`` the request passes, in words, or None."""
    where = f"GpuQuota {quota}" + (f", GPU model {model}" if model else "")
    checks = (("GPU memory", limits.memory_mib, used.memory_mib, asked.memory_mib, _mib),
              ("GPU compute (percent of one GPU)", limits.compute, used.compute, asked.compute, _percent),
              ("whole GPUs", limits.cards, used.cards, asked.cards, str))
    for what, limit, held, wanted, shown in checks:
        if limit is not None and wanted > 0 and held + wanted > limit:
            return (f"{where}: {what} limit {shown(limit)}, used {shown(held)}, asked {shown(wanted)}")
    return None


def _mib(value: int) -> str:
    return f"{value} MiB"


def _percent(value: int) -> str:
    """Per-mille as the percent the pod API speaks, without a ``%`` sign: kube-scheduler passes an
    extender's reasons through a format string, which turns ``%,`` into ``%!,(MISSING)``."""
    return f"{value / 10:g}"


def quota_verdict(quotas: Iterable[Quota], used: ModelUse, asked: ModelUse) -> str | None:
    """Why the tenant holding ``used`` may not take ``asked`` (both per GPU model), naming the quota,
    the limit, what is used and what is asked; None when every quota leaves room."""
    used_total, asked_total = total(used), total(asked)
    for quota in quotas:
        reason = _over(quota.name, "", quota.hard, used_total, asked_total)
        if reason is not None:
            return reason
        for model, limits in quota.per_model:
            reason = _over(quota.name, model, limits, used.get(model, NOTHING), asked.get(model, NOTHING))
            if reason is not None:
                return reason
    return None


def request_amounts(request: GpuRequest, card_mib: int, card_compute: int = COMPUTE_PER_CARD) -> Amounts:
    """What one container's request takes on cards of ``card_mib`` MiB (and ``card_compute``)."""
    if request.exclusive:
        return Amounts(card_mib * request.count, card_compute * request.count, request.count)
    memory = request.memory_mib if request.memory_mib is not None else card_mib * request.compute // COMPUTE_PER_CARD
    return Amounts(memory * request.count, request.compute * request.count, 0)


def pod_amounts(pod: PodRequest, card_mib: int) -> Amounts:
    """What the pod takes on cards of ``card_mib`` MiB: its app containers together, or its largest
    init container where that is more (init containers run before the app containers)."""
    app = NOTHING
    for container in pod.gpu_containers:
        assert container.gpu is not None
        app = app + request_amounts(container.gpu, card_mib)
    for container in pod.init_containers:
        if container.gpu is not None:
            init = request_amounts(container.gpu, card_mib)
            app = Amounts(max(app.memory_mib, init.memory_mib), max(app.compute, init.compute),
                          max(app.cards, init.cards))
    return app


class ModelSizes:
    """The largest card of each GPU model in the ledger, kept per node layout."""

    def __init__(self) -> None:
        self._seen: tuple[int, int] | None = None
        self._sizes: dict[str, int] = {}

    def of(self, state: ClusterState) -> Mapping[str, int]:
        key = (id(state), state.layout_version)
        if self._seen != key:
            present = state.card_exists & state.present[:, None]
            self._sizes = {}
            for model_id in np.unique(state.card_model[present]).tolist():
                at = present & (state.card_model == model_id)
                self._sizes[state.models[model_id]] = int(state.card_mem_total[at].max())
            self._seen = key
        return self._sizes


def refused_models(quotas: Iterable[Quota], used: ModelUse, pod: PodRequest,
                   sizes: Mapping[str, int]) -> dict[str, str]:
    """Per GPU model of the cluster, why the pod would pass a quota if its cards were of that model
    (its demand estimated on the model's largest card); models with room are absent.

    The filter closes the refused models to the pod (its card scope avoids them) so it is sent only
    where it can still fit; the bind then checks the exact placement with :func:`quota_verdict`.
    """
    quotas = tuple(quotas)
    refused: dict[str, str] = {}
    if not quotas:
        return refused
    for model, card_mib in sizes.items():
        reason = quota_verdict(quotas, used, {model: pod_amounts(pod, card_mib)})
        if reason is not None:
            refused[model] = reason
    return refused


def refused_everywhere(refused: Mapping[str, str], sizes: Mapping[str, int]) -> str | None:
    """The reason refusing the pod on every node, when :func:`refused_models` closed every GPU model
    of the cluster to it (its quotas' reasons, sorted and joined); None while some model has room.

    The filter refuses the pod everywhere with it, and the admission webhook rejects at create time
    with it a pod that no model could hold even in an empty namespace: one rule, one text.
    """
    if refused and set(refused) >= set(sizes):
        return refused_text(refused)
    return None


def refused_text(refused: Mapping[str, str]) -> str:
    """The refused models' reasons as one sentence (each distinct reason once, sorted)."""
    return "; ".join(sorted(set(refused.values())))
