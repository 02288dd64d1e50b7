"""The ``GpuQuota`` custom resource (namespaced), decoded into the core's :class:`Quota`.

::

    apiVersion: gpupool.io/v1alpha1
    kind: GpuQuota
    metadata: {name: gpus, namespace: team-a}
    spec:
      hard:                      # the namespace's GPU pods together (every field optional)
        memoryMiB: 65536         # card memory held, MiB
        computePercent: 400      # compute held, percent of one card (a whole card is 100)
        wholeGpus: 2             # cards held exclusively
      models:                    # the same limits per GPU model (the model name the inventory shows)
        A100-SXM4-40GB: {wholeGpus: 1}
      pools: [public]            # node pools (values of the gpupool.io/pool node label); omitted: any

Units follow the pod API: compute in percent as ``gpupool.io/gpu-core``, memory in MiB (the
quota's sums are exact in MiB, and a 256 MiB unit would round a slice of 1,000 MiB).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.api.fields import shown
from gpupool.api.tenancy import TenancyError, list_field, name_field, object_field, object_name
from gpupool.core.quota import Limits, Quota

MAX_QUOTA_MIB = 1 << 40
"""Memory a quota may allow (1 EiB): any sum over a cluster's cards stays far inside int64."""
MAX_QUOTA_PERCENT = 1 << 31
MAX_QUOTA_GPUS = 1 << 31
MAX_QUOTA_MODELS = 1_000
MAX_QUOTA_POOLS = 1_000
LIMIT_FIELDS = ("memoryMiB", "computePercent", "wholeGpus")


def _limit(spec: Mapping[str, Any], key: str, where: str, most: int) -> int | None:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TenancyError(f"{where}.{key}: expected an integer, got {shown(value)}")
    if not 0 <= value <= most:
        raise TenancyError(f"{where}.{key}: must be within 0..{most}, got {shown(value)}")
    return value


def _limits(raw: Any, where: str) -> Limits:
    spec = object_field(raw, where)
    unknown = sorted(set(spec) - set(LIMIT_FIELDS))
    if unknown:
        raise TenancyError(f"{where}: unknown field(s) {', '.join(map(shown, unknown))}; "
                           f"known: {', '.join(LIMIT_FIELDS)}")
    percent = _limit(spec, "computePercent", where, MAX_QUOTA_PERCENT)
    return Limits(memory_mib=_limit(spec, "memoryMiB", where, MAX_QUOTA_MIB),
                  compute=None if percent is None else percent * 10,
                  cards=_limit(spec, "wholeGpus", where, MAX_QUOTA_GPUS))


def decode_quota(obj: Mapping[str, Any]) -> Quota:
    """A ``GpuQuota`` object (JSON as the API serves it), checked field by field."""
    namespace, name = object_name(obj)
    if not namespace:
        raise TenancyError(f"GpuQuota {name}: metadata.namespace: missing (GpuQuota is namespaced)")
    where = f"GpuQuota {namespace}/{name}"
    spec = object_field(obj.get("spec"), f"{where}: spec")
    hard = _limits(spec.get("hard"), f"{where}: spec.hard")
    models = object_field(spec.get("models"), f"{where}: spec.models")
    if len(models) > MAX_QUOTA_MODELS:
        raise TenancyError(f"{where}: spec.models: at most {MAX_QUOTA_MODELS} models, got {len(models)}")
    if "" in models:  # the CRD refuses it (x-kubernetes-validations); an older CRD let it through
        raise TenancyError(f"{where}: spec.models has an empty GPU model name (key ''); name the model as "
                           "the node inventory shows it, or remove the entry")
    per_model = tuple((name_field(model, f"{where}: spec.models key"), _limits(raw, f"{where}: spec.models.{model}"))
                      for model, raw in sorted(models.items()))
    pools = frozenset(name_field(p, f"{where}: spec.pools[{i}]")
                      for i, p in enumerate(list_field(spec.get("pools"), f"{where}: spec.pools", MAX_QUOTA_POOLS)))
    return Quota(f"{namespace}/{name}", namespace, hard, per_model, pools)


def refusing_quota(namespace: str, name: str, problem: str) -> Quota:
    """What a quota that cannot be read stands for: no GPU at all for its namespace (a broken
    limit must not turn into no limit), named so the refusal says why."""
    return Quota(f"{namespace}/{name} (unreadable: {problem})", namespace, Limits(0, 0, 0))
