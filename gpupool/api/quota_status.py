"""The ``status`` of a ``GpuQuota``: what its namespace holds against each limit, overall and per GPU
model, as the extender's ledger counts it (:mod:`gpupool.core.usage`).

::

    status:
      hard: {wholeGpus: 2}                                  # the spec's limits, in its units
      used: {memoryMiB: 32768, computePercent: 200, wholeGpus: 2}
      models:
        Tesla-T4: {hard: {wholeGpus: 1}, used: {memoryMiB: 16384, computePercent: 100, wholeGpus: 1}}
      problem: "..."                                        # only when the quota cannot be read

Why every dimension is shown as used while only the limited ones as hard: the admin reads where the
namespace stands before setting a limit. Models listed are those the spec limits and those the
namespace holds cards of. ``computePercent`` is a percent of one GPU, as in the spec and
``gpupool.io/gpu-core``; a slice of 2.5 percent shows as 2.5, which is why the status schema says
``number`` where the spec says ``integer``.

A pure function of (quota, use), so the writer compares two values to know whether anything changed
and tests need no cluster.
"""

from __future__ import annotations

from typing import Any

from gpupool.core.quota import Limits, Quota
from gpupool.core.usage import NOTHING, Amounts, ModelUse, total

Number = int | float


def _percent(per_mille: int) -> Number:
    return per_mille // 10 if per_mille % 10 == 0 else per_mille / 10


def encode_hard(limits: Limits) -> dict[str, Number]:
    """The limited dimensions of ``limits`` in the spec's units."""
    found: dict[str, Number] = {}
    if limits.memory_mib is not None:
        found["memoryMiB"] = limits.memory_mib
    if limits.compute is not None:
        found["computePercent"] = _percent(limits.compute)
    if limits.cards is not None:
        found["wholeGpus"] = limits.cards
    return found


def encode_used(amounts: Amounts) -> dict[str, Number]:
    """Every dimension of ``amounts`` in the spec's units."""
    return {"memoryMiB": amounts.memory_mib, "computePercent": _percent(amounts.compute),
            "wholeGpus": amounts.cards}


def quota_status(quota: Quota, used: ModelUse, problem: str | None = None) -> dict[str, Any]:
    """The status of ``quota`` for its namespace holding ``used`` (per GPU model); ``problem``: why
    the object cannot be read (its limits are then zero, as the extender applies them)."""
    limited = dict(quota.per_model)
    models: dict[str, Any] = {}
    for model in sorted(set(limited) | {m for m, a in used.items() if not a.zero}):
        entry: dict[str, Any] = {"used": encode_used(used.get(model, NOTHING))}
        if model in limited:
            entry["hard"] = encode_hard(limited[model])
        models[model] = entry
    status: dict[str, Any] = {"hard": encode_hard(quota.hard), "used": encode_used(total(used))}
    if models:
        status["models"] = models
    if problem is not None:
        status["problem"] = problem
    return status
