"""A pod's tenancy, as its object states it: namespace, ServiceAccount, the group it names and its
per-pod card controls (pinned GPUs, avoided GPUs and models, HAMi's model words).

The controls become a :class:`CardScope` here, so that the extender narrows the pod's request with
them exactly as it narrows it with a group or a quota (one mechanism, see
:mod:`gpupool.core.card_scope`). HAMi's annotation names are read as aliases of gpupool's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.tenancy import (
    HAMI_AVOID_MODELS,
    HAMI_AVOID_UUIDS,
    HAMI_PIN_UUIDS,
    HAMI_USE_MODELS,
    TenancyError,
    TenancyNames,
    name_list,
)
from gpupool.core.card_scope import CardScope, CardSet
from gpupool.kube.translate import TranslationError, as_dict, pod_key


@dataclass(frozen=True)
class PodTenancy:
    """Who a pod is (namespace, ServiceAccount), the group it names ("" for none) and its own card
    controls (None: none)."""

    namespace: str
    service_account: str = "default"
    group: str = ""
    controls: CardScope | None = None


def _annotation(annotations: Mapping[str, Any], names: tuple[str, ...], where: str) -> frozenset[str]:
    """The union of an annotation and its HAMi alias, as names."""
    found: frozenset[str] = frozenset()
    for name in names:
        if name in annotations:
            found |= name_list(annotations[name], f"{where}: annotation {name}")
    return found


def pod_tenancy(pod: Mapping[str, Any] | Any, names: TenancyNames) -> PodTenancy:
    """Read a pod's tenancy; :class:`TranslationError` names a broken label or annotation."""
    raw = as_dict(pod)
    where = f"pod {pod_key(raw)}"
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    try:
        group = labels.get(names.group_label, "")
        if not isinstance(group, str):
            raise TenancyError(f"{where}: label {names.group_label} must be a string")
        pins = _annotation(annotations, (names.gpu_uuids, HAMI_PIN_UUIDS), where)
        avoid = _annotation(annotations, (names.avoid_gpu_uuids, HAMI_AVOID_UUIDS), where)
        models = _annotation(annotations, (names.avoid_gpu_models,), where)
        use_words = _annotation(annotations, (HAMI_USE_MODELS,), where)
        avoid_words = _annotation(annotations, (HAMI_AVOID_MODELS,), where)
    except TenancyError as exc:
        raise TranslationError(str(exc)) from None
    controls = None
    if pins or avoid or models or use_words or avoid_words:
        controls = CardScope("the GPUs the pod's annotations allow", (CardSet(uuids=pins),) if pins else (),
                             CardSet(uuids=avoid), models, (use_words,) if use_words else (), avoid_words)
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    return PodTenancy(namespace=str(meta.get("namespace") or "default"), service_account=str(account),
                      group=group.strip(), controls=controls)


def namespace_defaults(namespace: Mapping[str, Any], names: TenancyNames) -> tuple[str, tuple[str, ...], str | None]:
    """``(name, default groups, problem)`` of a Namespace object: the groups its annotation (or
    label) names for pods that name none; ``problem`` says why the value cannot be read (the
    namespace then has no default group, and its pods without a group are refused with the reason)."""
    meta = namespace.get("metadata") or {}
    name = str(meta.get("name") or "")
    value = (meta.get("annotations") or {}).get(names.default_groups)
    if value is None:
        value = (meta.get("labels") or {}).get(names.default_groups)
    if value is None:
        return name, (), None
    try:
        return name, tuple(sorted(name_list(value, f"namespace {name}: {names.default_groups}"))), None
    except TenancyError as exc:
        return name, (), str(exc)
