"""Kubernetes objects (JSON dicts or client models) → the core's :class:`PodRequest` and :class:`NodeSpec`.

Why dicts: kube-scheduler sends pods and nodes as JSON, the watch delivers raw JSON, and client
models convert to the same camelCase dicts (:func:`as_dict`), so one code path serves all three.

The rules, per container (limits first, requests when no limit is given; both given and different
is an error, as the API itself demands for extended resources):

* ``<domain>/gpu: n``: n whole cards, exclusive. It is never combined with a slice: kubelet takes
  one whole-card device per unit of it, so a shared slice that also asked for ``gpu`` would use up
  whole-card devices while the extender books only a share of the cards, and kubelet would refuse
  pods the extender placed beside it (refused here with the reason and the right spelling).
* ``<domain>/gpu-mem: units`` (256 MiB each, per card) and/or ``<domain>/gpu-core: percent`` (per
  card): a slice of each of ``n`` cards (``n`` = ``<domain>/gpu-shared`` or 1). The memory unit is
  the node's kubelet device (``g<i>-m<k>``): kubelet admits a container only if the node has as many
  free devices as its limit says, so the limit must count devices, not MiB. Memory without
  compute takes no compute share (gpushare); compute without memory takes the same share of the
  card's memory (the trace's meaning).
  ``gpu-core: 100`` is a whole card (``gpu-shared: n`` with it: n whole cards).
* ``<domain>/gpu-shared: n`` without memory or compute is refused (whole cards are ``gpu``).
* Aliases: ``aliyun.com/gpu-mem`` (GiB, or MiB per deployment; a total over the cards of the pod
  label ``aliyun.com/gpu-count``), ``tencent.com/vcuda-memory`` (256 MiB units),
  ``tencent.com/vcuda-core`` (percent; above 100 a multiple of 100 means that many whole cards);
  HAMi's ``nvidia.com/gpu`` with ``gpumem``, ``gpumem-percentage``, ``gpucores``, ``priority``,
  read as HAMi means them (:mod:`gpupool.kube.foreign`).
* Pod annotations and labels: :mod:`gpupool.kube.pod_options` (exclusive, models, card kind, the
  pod's node and card policy).

Init containers with ``restartPolicy: Always`` are sidecars: they run beside the app containers, so
they are counted as app containers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal
from typing import Any

from gpupool.api import names as n
from gpupool.api.annotations import AnnotationError, decode_inventory
from gpupool.api.fields import shown
from gpupool.api.limits import (
    MAX_CARD_MEMORY_MIB,
    MAX_CARDS_PER_NODE,
    MAX_NODE_CPU_MILLI,
    MAX_NODE_MEMORY_MIB,
    text_problem,
)
from gpupool.api.names import ResourceNames
from gpupool.api.remote_share import wants_remote
from gpupool.core.model import ContainerRequest, GpuCard, GpuRequest, NodeSpec, PodRequest
from gpupool.core.remote_share import remote_shape_problem
from gpupool.core.units import MEMORY_UNIT_MIB, percent_to_compute
from gpupool.kube.foreign import ForeignRequestError, gpushare_per_card, hami_request, is_hami
from gpupool.kube.memory_units import memory_units, unit_problem
from gpupool.kube.pod_options import PodOptionError, PodOptions, pod_options
from gpupool.kube.quantity import QuantityError, parse_quantity

MIB = 1024 * 1024
MAX_PRIORITY = (1 << 31) - 1
"""``spec.priority`` is an int32 in the API."""

#: Label the NVIDIA GPU feature discovery sets; used as the model of fallback cards when present.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
FALLBACK_MODEL = "unknown"
NO_OPTIONS = PodOptions()
"""A pod whose metadata asks nothing of its GPUs."""


class TranslationError(ValueError):
    """A pod or node that cannot be read; the message names the object and the field."""


class InvalidObjectError(TranslationError):
    """A value the apiserver itself refuses (not a quantity, out of its range, a container name
    that is no name): an object carrying it never came from a cluster, so the extender answers a
    request with it as malformed (400) rather than as a pod that does not fit."""


def as_dict(obj: Any) -> dict[str, Any]:
    """A client model (``V1Pod``, ``V1Node``) or a dict as the API's camelCase JSON dict."""
    if isinstance(obj, dict):
        return obj
    from kubernetes.client import ApiClient

    serialize: Any = ApiClient().sanitize_for_serialization
    result = serialize(obj)
    if not isinstance(result, dict):
        raise TranslationError(f"expected a Kubernetes object, got {type(obj).__name__}")
    return result


def _map(obj: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TranslationError(f"{where}.{key}: expected an object")
    return value


def _list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise TranslationError(f"{where}.{key}: expected a list")
    return value


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod dict (namespace defaults to ``default``)."""
    meta = _map(pod, "metadata", "pod")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise TranslationError("pod.metadata.name: missing")
    namespace = meta.get("namespace") or "default"
    for field, value in (("name", name), ("namespace", namespace)):
        problem = text_problem(value) if isinstance(value, str) else "must be a string"
        if problem is not None:  # names reach log lines and events: no control characters
            raise InvalidObjectError(f"pod.metadata.{field} {shown(value)}: {problem}")
    return f"{namespace}/{name}"


def _quantity(value: Any, resource: str, where: str) -> Decimal:
    try:
        q = parse_quantity(value)
    except QuantityError as exc:
        raise InvalidObjectError(f"{where}: {resource}={shown(value)} {exc}") from None
    if q < 0:
        raise TranslationError(f"{where}: {resource}={shown(value)} must be non-negative")
    return q


def _count(value: Any, resource: str, where: str) -> int:
    q = _quantity(value, resource, where)
    if q != q.to_integral_value():
        raise TranslationError(f"{where}: {resource}={shown(value)} must be a whole number")
    return int(q)


def _at_most(value: int, maximum: int, what: str, where: str) -> int:
    """``value`` if within gpupool's bound for one node (:mod:`gpupool.api.limits`), else the reason:
    a value past it fits no node and would overflow the ledger's ``int64`` sums."""
    if value > maximum:
        raise TranslationError(f"{where}: {what}={value} exceeds gpupool's bound for one node (at most {maximum})")
    return value


def _extended(container: Mapping[str, Any], where: str, managed: tuple[str, ...]) -> dict[str, int]:
    """The managed extended resources a container asks for (limits, else requests)."""
    resources = _map(container, "resources", where)
    limits = _map(resources, "limits", f"{where}.resources")
    requests = _map(resources, "requests", f"{where}.resources")
    found: dict[str, int] = {}
    for name in managed:
        limit = limits.get(name)
        request = requests.get(name)
        if limit is None and request is None:
            continue
        if limit is not None and request is not None and \
                _count(limit, name, where) != _count(request, name, where):
            raise TranslationError(f"{where}: {name} request {request!r} differs from limit {limit!r}; "
                                   "extended resources must have request == limit")
        value = _count(limit if limit is not None else request, name, where)
        if value:
            found[name] = value
    return found


def _one_of(found: Mapping[str, int], options: Mapping[str, int], what: str, where: str) -> int | None:
    """The value of the single option present (scaled), or None; two present is ambiguous."""
    present = [name for name in options if name in found]
    if len(present) > 1:
        raise TranslationError(f"{where}: {what} given twice ({', '.join(present)}); use one name")
    if not present:
        return None
    return found[present[0]] * options[present[0]]


def gpu_request(found: Mapping[str, int], names: ResourceNames, where: str,
                options: PodOptions = NO_OPTIONS) -> GpuRequest | None:
    """The per-card GPU request of one container from its resources (see module doc); None for a
    container without any of gpupool's (a bare ``nvidia.com/gpu`` is NVIDIA's plugin's unless
    ``names.hami``)."""
    if not found or (not names.hami and set(found) == {n.NVIDIA_GPU}):
        return None
    try:
        if is_hami(found):
            return hami_request(found, where, exclusive=options.exclusive, models=options.models,
                                kind=options.kind)
        found = gpushare_per_card(found, names, options.gpushare_cards, where)
    except ForeignRequestError as exc:
        raise TranslationError(str(exc)) from None
    request = _native_request(found, names, where, exclusive=options.exclusive, models=options.models)
    request = _virtual(request, names, where, options)
    return request if options.kind is None else replace(request, kind=options.kind)


def _virtual(request: GpuRequest, names: ResourceNames, where: str, options: PodOptions) -> GpuRequest:
    """``request`` with the pod's virtual-card mode: it applies to a slice of several cards; a
    one-card slice is left as it is, whole cards are refused (one card cannot be n whole cards)."""
    if options.virtual_cards is None or request.count == 1:
        return request
    if request.exclusive:
        raise TranslationError(f"{where}: annotation {names.virtual_cards} serves a slice of several cards from "
                               f"one card, not {request.count} whole cards; ask {names.gpu_shared}: "
                               f"{request.count} with {names.gpu_mem} and/or {names.gpu_core}")
    try:
        return replace(request, virtual=options.virtual_cards)
    except ValueError as exc:
        raise TranslationError(f"{where}: annotation {names.virtual_cards}: {exc}") from None


def _native_request(found: Mapping[str, int], names: ResourceNames, where: str, *,
                    exclusive: bool, models: frozenset[str]) -> GpuRequest:
    """gpupool's own names, gpushare's and GPUManager's (one meaning per unit, see module doc)."""
    whole_cards = found.get(names.gpu)
    count = found.get(names.gpu_shared)
    units = memory_units(names)
    memory = _one_of(found, units, "GPU memory", where)
    core = _one_of(found, {names.gpu_core: 1, n.TENCENT_VCUDA_CORE: 1}, "GPU compute", where)
    for card_count in (names.gpu, names.gpu_shared):
        if card_count in found:
            _at_most(found[card_count], MAX_CARDS_PER_NODE, card_count, where)
    problem = unit_problem(found, units)  # 1 TiB or more: a count in the wrong unit
    if problem is not None:
        raise TranslationError(f"{where}: {problem}")
    if whole_cards is not None:
        slice_names = [r for r in found if r != names.gpu]
        if slice_names:
            raise TranslationError(
                f"{where}: {names.gpu} counts whole exclusive cards and cannot be combined with "
                f"{', '.join(slice_names)}; for a slice of several cards write {names.gpu_shared}: "
                f"{whole_cards} beside the slice's memory/compute")
        return GpuRequest.whole(whole_cards, models)
    if memory is None and core is None:
        raise TranslationError(f"{where}: {names.gpu_shared} gives the card count of a slice; add "
                               f"{names.gpu_mem} and/or {names.gpu_core} (whole cards: {names.gpu})")
    if core is not None and core > 100:
        if n.TENCENT_VCUDA_CORE in found and core % 100 == 0:
            whole = _at_most(core // 100, MAX_CARDS_PER_NODE, f"{n.TENCENT_VCUDA_CORE} (whole cards)", where)
            if count is not None and count != whole:
                raise TranslationError(f"{where}: {n.TENCENT_VCUDA_CORE}={core} means {whole} cards, "
                                       f"but {names.gpu_shared}={count}")
            return GpuRequest.whole(whole, models)
        raise TranslationError(f"{where}: GPU compute is a percentage of one card (1..100), got {core}")
    if exclusive or core == 100:
        return GpuRequest.whole(count or 1, models)
    try:
        return GpuRequest(count=count or 1, compute=percent_to_compute(core or 0),
                          memory_mib=memory if memory is not None else (None if core else 0), models=models)
    except ValueError as exc:
        raise TranslationError(f"{where}: {exc}") from None


def _cpu_memory(container: Mapping[str, Any], where: str) -> tuple[int, int]:
    resources = _map(container, "resources", where)
    requests = _map(resources, "requests", f"{where}.resources")
    limits = _map(resources, "limits", f"{where}.resources")
    return _cpu_memory_from(requests, limits, where)


def _cpu_memory_from(first: Mapping[str, Any], fallback: Mapping[str, Any], where: str) -> tuple[int, int]:
    """CPU milli and memory MiB from ``first`` (a container's requests, a node's allocatable), each
    falling back to ``fallback`` (limits, capacity); 0 where neither names it."""
    cpu = first.get("cpu", fallback.get("cpu"))
    memory = first.get("memory", fallback.get("memory"))
    cpu_milli = int(_quantity(cpu, "cpu", where) * 1000) if cpu is not None else 0
    memory_mib = int(_quantity(memory, "memory", where) / MIB) if memory is not None else 0
    return (_at_most(cpu_milli, MAX_NODE_CPU_MILLI, "cpu (milli)", where),
            _at_most(memory_mib, MAX_NODE_MEMORY_MIB, "memory (MiB)", where))


def pod_wants_gpu(pod: Mapping[str, Any], names: ResourceNames) -> bool:
    """Whether any container asks for a managed resource (cheap; no validation: a malformed part
    of the pod asks for nothing, and :func:`pod_request` says what is wrong with it)."""
    managed = names.managed()
    spec = _loose(pod.get("spec"))
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        for container in containers if isinstance(containers, list) else ():
            resources = _loose(_loose(container).get("resources"))
            for part in ("limits", "requests"):
                asked = _loose(resources.get(part))
                if any(name in asked for name in managed):
                    return True
    return False


def _loose(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def foreign_resources(pod: Mapping[str, Any] | Any) -> frozenset[str]:
    """The foreign resources (``aliyun.com/gpu-mem``, ``nvidia.com/gpu``, ...) kubelet must find on a
    node for the pod: the aliases it asks for, with HAMi's memory/compute names standing for
    ``nvidia.com/gpu``, which carries them (no node advertises those, see ``CARRIED_BY``).

    A node serves an alias only when its node agent advertises it (kubelet then lists it in the
    node's allocatable); elsewhere kubelet would drop it silently and start the container without a
    GPU grant, so the extender sends such pods only to nodes that serve every alias they use.
    """
    spec = as_dict(pod).get("spec") or {}
    found: set[str] = set()
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or ():
            resources = (container or {}).get("resources") or {}
            asked = {name for part in ("limits", "requests") for name in resources.get(part) or {}}
            carried = {name for name in asked if name in n.CARRIED_BY}
            found.update(name for name in asked if name in n.SERVABLE)
            # carried names stand for their carrier; without it in the container no node serves them
            found.update({n.CARRIED_BY[name] for name in carried} if n.NVIDIA_GPU in asked else carried)
    return frozenset(found)


def pod_request(pod: Mapping[str, Any] | Any, names: ResourceNames) -> PodRequest:
    """Translate a pod into the core's request; raises :class:`TranslationError` with the reason."""
    pod = as_dict(pod)
    key = pod_key(pod)
    where = f"pod {key}"
    meta = _map(pod, "metadata", where)
    spec = _map(pod, "spec", where)
    try:
        options = pod_options(meta, names)
        remote = wants_remote(meta.get("annotations") or {}, names)
    except (PodOptionError, AnnotationError) as exc:
        raise TranslationError(f"{where}: {exc}") from None
    readable = names.readable()

    def container(raw: Any, kind: str) -> ContainerRequest:
        if not isinstance(raw, Mapping):
            raise TranslationError(f"{where}: every entry of spec.{kind} must be an object")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise TranslationError(f"{where}: a container in spec.{kind} has no name")
        problem = text_problem(name)
        if problem is not None:
            raise InvalidObjectError(f"{where}: container name {shown(name)} in spec.{kind} {problem}")
        cwhere = f"{where} container {name}"
        cpu, memory = _cpu_memory(raw, cwhere)
        found = _extended(raw, cwhere, readable)
        carried = sorted(r for r in found if r in n.CARRIED_BY)
        if kind == "initContainers" and carried:  # kubelet drops unadvertised names for app containers only
            raise TranslationError(f"{cwhere}: kubelet refuses an init container asking for {', '.join(carried)} "
                                   "(no node advertises it); ask for whole cards with nvidia.com/gpu alone or "
                                   "give the slice to an app container")
        gpu = gpu_request(found, names, cwhere, options)
        return ContainerRequest(name=name, cpu_milli=cpu, memory_mib=memory, gpu=gpu)

    apps = [container(c, "containers") for c in _list(spec, "containers", where)]
    inits: list[ContainerRequest] = []
    for raw in _list(spec, "initContainers", where):
        translated = container(raw, "initContainers")
        if isinstance(raw, Mapping) and raw.get("restartPolicy") == "Always":
            apps.append(translated)  # a sidecar runs beside the app containers
        else:
            inits.append(translated)
    seen: set[str] = set()
    for c in (*apps, *inits):
        if c.name in seen:
            raise TranslationError(f"{where}: container name {c.name!r} appears twice")
        seen.add(c.name)
    priority = spec.get("priority") or 0
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > MAX_PRIORITY:
        raise InvalidObjectError(f"{where}: spec.priority must be a 32-bit integer, got {shown(priority)}")
    request = PodRequest(key=key, containers=tuple(apps), init_containers=tuple(inits), priority=priority,
                         policy=options.policy, remote=remote and any(c.gpu for c in (*apps, *inits)))
    problem = remote_shape_problem(request) if request.remote else None
    if problem is not None:
        raise TranslationError(f"{where}: annotation {names.remote_gpu}: {problem}")
    return request


# ------------------------------------------------------------------------------------------ nodes
def node_spec(node: Mapping[str, Any] | Any, names: ResourceNames) -> NodeSpec:
    """Translate a node: cards from ``<domain>/inventory-v1``, else the capacity fallback.

    Fallback when the annotation is absent: ``<domain>/gpu`` in the node's capacity gives the card
    count and ``<domain>/gpu-mem`` the total memory in 256 MiB devices (what the device plugin
    advertises), split evenly over the cards (uuids are
    synthesised as ``<node>-gpu<i>``; the model is the ``nvidia.com/gpu.product`` label or
    ``unknown``). A broken annotation raises :class:`TranslationError`: the caller keeps the node
    without cards and reports the reason, rather than guessing its cards.
    """
    node = as_dict(node)
    meta = _map(node, "metadata", "node")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise TranslationError("node.metadata.name: missing")
    where = f"node {name}"
    status = _map(node, "status", where)
    allocatable = _map(status, "allocatable", f"{where}.status")
    capacity = _map(status, "capacity", f"{where}.status")
    cpu_milli, memory_mib = _cpu_memory_from(allocatable, capacity, where)
    labels = dict(_map(meta, "labels", f"{where}.metadata"))
    annotations = _map(meta, "annotations", f"{where}.metadata")
    raw_inventory = annotations.get(names.inventory)
    topology = None
    if raw_inventory is not None:
        try:
            inventory = decode_inventory(raw_inventory)
        except AnnotationError as exc:
            raise TranslationError(f"{where}: {exc}") from None
        cards = inventory.cards
        topology = inventory.topology
    else:
        cards = _fallback_cards(name, capacity or allocatable, labels, names, where)
    return NodeSpec(name=name, cpu_milli=cpu_milli, memory_mib=memory_mib, cards=cards, labels=labels,
                    topology=topology)


def _fallback_cards(name: str, capacity: Mapping[str, Any], labels: Mapping[str, str],
                    names: ResourceNames, where: str) -> tuple[GpuCard, ...]:
    count_raw = capacity.get(names.gpu)
    if count_raw is None:
        return ()
    count = _at_most(_count(count_raw, names.gpu, where), MAX_CARDS_PER_NODE, names.gpu, where)
    total_raw = capacity.get(names.gpu_mem)
    total = _count(total_raw, names.gpu_mem, where) * MEMORY_UNIT_MIB if total_raw is not None else 0
    model = labels.get(GPU_PRODUCT_LABEL, FALLBACK_MODEL)
    per_card = _at_most(total // count if count else 0, MAX_CARD_MEMORY_MIB, "GPU memory per card (MiB)", where)
    return tuple(GpuCard(index=i, uuid=f"{name}-gpu{i}", model=model, memory_mib=per_card)
                 for i in range(count))
