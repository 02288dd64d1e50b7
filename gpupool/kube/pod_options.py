"""What a pod's metadata asks of its GPU placement: annotations (gpupool's and HAMi's) and labels.

One reader for every per-pod control, so that gpupool's names and the foreign ones users bring
from HAMi or Alibaba's cGPU mean one thing and disagree loudly:

* ``<domain>/exclusive: "true"``: whole cards for every GPU container;
* ``<domain>/gpu-models``: allowed models, exact names, comma-separated;
* ``<domain>/virtual-cards`` ``shared|exclusive``: a slice of n cards may be served by one card
  presented as n devices (:mod:`gpupool.core.virtual_cards`);
* ``<domain>/gpu-kind`` ``physical|virtual``, or HAMi's ``nvidia.com/vgpu-mode`` (``mig`` is a
  virtual card, ``hami-core`` and ``mps`` share a physical one; several modes: either kind);
* ``<domain>/node-policy`` / ``<domain>/gpu-policy`` and HAMi's ``hami.io/node-scheduler-policy`` /
  ``hami.io/gpu-scheduler-policy``: ``binpack`` or ``spread`` for this pod (HAMi's
  ``topology-aware`` card policy is what gpupool does for multi-card pods anyway); the two
  spellings given with different values is an error;
* the label ``aliyun.com/gpu-count``: cGPU's card count for a pod's ``aliyun.com/gpu-mem`` total;
* HAMi's card restrictions: ``use-gputype``, ``nouse-gputype`` (words matched in the card's model,
  any case, as HAMi matches them), ``use-gpuuuid`` and ``nouse-gpuuuid`` are applied by the pod's
  card scope (:mod:`gpupool.kube.tenancy`); :class:`CardRestrictions` states HAMi's rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api import names as n
from gpupool.api.limits import MAX_CARDS_PER_NODE
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuKind, VirtualCards
from gpupool.core.pod_policy import CARD_CHOICES, NODE_CHOICES, PolicyChoice


class PodOptionError(ValueError):
    """An annotation or label with a value gpupool cannot read; the message names it."""


#: HAMi's vgpu-mode values and the kind of card each runs on.
VGPU_MODE_KINDS: dict[str, GpuKind] = {"mig": GpuKind.VIRTUAL, "hami-core": GpuKind.PHYSICAL,
                                       "mps": GpuKind.PHYSICAL}
#: HAMi's card policy that gpupool always applies to multi-card pods (read as "no override").
TOPOLOGY_AWARE = "topology-aware"


@dataclass(frozen=True)
class CardRestrictions:
    """HAMi's per-pod card filters. Types match as HAMi matches them: case-insensitive substrings of
    the card's model (``A100`` takes ``NVIDIA-A100-SXM4-80GB``); UUIDs exactly. ``use_uuids`` set:
    only those cards (HAMi then ignores ``avoid_uuids``)."""

    use_types: frozenset[str] = frozenset()
    avoid_types: frozenset[str] = frozenset()
    use_uuids: frozenset[str] = frozenset()
    avoid_uuids: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return not (self.use_types or self.avoid_types or self.use_uuids or self.avoid_uuids)

    def allows(self, model: str, uuid: str) -> bool:
        """Whether a card of ``model`` and ``uuid`` passes every filter."""
        upper = model.upper()
        if self.use_types and not any(t.upper() in upper for t in self.use_types):
            return False
        if any(t.upper() in upper for t in self.avoid_types):
            return False
        if self.use_uuids:
            return uuid in self.use_uuids
        return uuid not in self.avoid_uuids


@dataclass(frozen=True)
class PodOptions:
    """Everything the pod's metadata says about its GPUs (see the module doc)."""

    exclusive: bool = False
    models: frozenset[str] = frozenset()
    kind: GpuKind | None = None
    policy: PolicyChoice | None = None
    gpushare_cards: int | None = None
    restrictions: CardRestrictions = CardRestrictions()
    virtual_cards: VirtualCards | None = None


def _text(values: Mapping[str, Any], key: str, what: str) -> str | None:
    value = values.get(key)
    if value is not None and not isinstance(value, str):
        raise PodOptionError(f"{what} {key} must be a string")
    return value


def _items(raw: str | None) -> frozenset[str]:
    return frozenset(part.strip() for part in (raw or "").split(",") if part.strip())


def hami_card_restrictions(annotations: Mapping[str, Any]) -> CardRestrictions:
    """HAMi's ``use``/``nouse`` type and UUID annotations of a pod (comma-separated lists)."""
    return CardRestrictions(
        use_types=_items(_text(annotations, n.HAMI_USE_GPUTYPE, "annotation")),
        avoid_types=_items(_text(annotations, n.HAMI_NOUSE_GPUTYPE, "annotation")),
        use_uuids=_items(_text(annotations, n.HAMI_USE_GPUUUID, "annotation")),
        avoid_uuids=_items(_text(annotations, n.HAMI_NOUSE_GPUUUID, "annotation")))


def _kind(annotations: Mapping[str, Any], names: ResourceNames) -> GpuKind | None:
    ours = _text(annotations, names.gpu_kind, "annotation")
    if ours is not None and ours not in (GpuKind.PHYSICAL, GpuKind.VIRTUAL):
        raise PodOptionError(f"annotation {names.gpu_kind} must be physical or virtual, got {ours!r}")
    modes = _items(_text(annotations, n.HAMI_VGPU_MODE, "annotation"))
    unknown = sorted(modes - VGPU_MODE_KINDS.keys())
    if unknown:
        raise PodOptionError(f"annotation {n.HAMI_VGPU_MODE}: unknown mode {', '.join(unknown)}; "
                             f"known: {', '.join(VGPU_MODE_KINDS)}")
    kinds = {VGPU_MODE_KINDS[m] for m in modes}
    theirs = kinds.pop() if len(kinds) == 1 else None
    if ours is not None and theirs is not None and ours != theirs:
        raise PodOptionError(f"annotations {names.gpu_kind}={ours} and {n.HAMI_VGPU_MODE} "
                             f"(a {theirs} card) disagree")
    return GpuKind(ours) if ours is not None else theirs


def _choice(annotations: Mapping[str, Any], ours: str, hamis: str, allowed: tuple[str, ...]) -> str | None:
    values = {key: _text(annotations, key, "annotation") for key in (ours, hamis)}
    if values[hamis] == TOPOLOGY_AWARE and hamis == n.HAMI_GPU_POLICY:
        values[hamis] = None
    for key, value in values.items():
        if value is not None and value not in allowed:
            raise PodOptionError(f"annotation {key} must be one of {', '.join(allowed)}, got {value!r}")
    given = {v for v in values.values() if v is not None}
    if len(given) > 1:
        raise PodOptionError(f"annotations {ours}={values[ours]} and {hamis}={values[hamis]} disagree")
    return given.pop() if given else None


def _policy(annotations: Mapping[str, Any], names: ResourceNames) -> PolicyChoice | None:
    choice = PolicyChoice(node=_choice(annotations, names.node_policy, n.HAMI_NODE_POLICY, NODE_CHOICES),
                          card=_choice(annotations, names.gpu_policy, n.HAMI_GPU_POLICY, CARD_CHOICES))
    return None if choice.is_default else choice


def _gpushare_cards(labels: Mapping[str, Any]) -> int | None:
    raw = _text(labels, n.ALIYUN_GPU_COUNT, "label")
    if raw is None:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_CARDS_PER_NODE:
        raise PodOptionError(f"label {n.ALIYUN_GPU_COUNT} must be a card count 1..{MAX_CARDS_PER_NODE}, "
                             f"got {raw!r}")
    return int(raw)


def _virtual_cards(annotations: Mapping[str, Any], names: ResourceNames) -> VirtualCards | None:
    raw = _text(annotations, names.virtual_cards, "annotation")
    if raw is None:
        return None
    modes = [m.value for m in VirtualCards]
    if raw not in modes:
        raise PodOptionError(f"annotation {names.virtual_cards} must be one of {', '.join(modes)}, got {raw!r}")
    return VirtualCards(raw)


def pod_options(meta: Mapping[str, Any], names: ResourceNames) -> PodOptions:
    """Read a pod's ``metadata``; :class:`PodOptionError` names the annotation or label at fault."""
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    if not isinstance(annotations, Mapping) or not isinstance(labels, Mapping):
        raise PodOptionError("metadata.annotations and metadata.labels must be objects")
    exclusive = _text(annotations, names.exclusive, "annotation") or "false"
    if exclusive not in ("true", "false"):
        raise PodOptionError(f"annotation {names.exclusive} must be \"true\" or \"false\", got {exclusive!r}")
    restrictions = hami_card_restrictions(annotations)
    return PodOptions(exclusive=exclusive == "true",
                      models=_items(_text(annotations, names.gpu_models, "annotation")),
                      kind=_kind(annotations, names), policy=_policy(annotations, names),
                      gpushare_cards=_gpushare_cards(labels), restrictions=restrictions,
                      virtual_cards=_virtual_cards(annotations, names))
