"""What a pending ResourceClaim asks of gpupool's cards, read from its spec: the extender's node
choice for a claim's pod (issue 24, docs/dra.md "Choosing between the extender path and the DRA
path") places these asks as the core places an extended-resource pod's GPU containers.

Read from ``spec.devices.requests``: each request of gpupool's device class (``exactly``) with
``allocationMode: ExactCount`` (the default) becomes one :class:`GpuRequest` of ``count`` cards
(the capacity applies to each device, as the allocator reads it): memory rounded up to the request
policy's 256 MiB step, compute in percent (booked per mille). A request that names no memory gets
the request policy's default, all of a card's memory: a whole card.

What cannot be modelled (``allocationMode: All``, ``firstAvailable`` alternatives, a malformed
quantity) makes the ask's ``problem``: the pod then gets no node choice from gpupool (the DRA
allocator still decides, kube-scheduler's scores choose the node), never a wrong one.

A request's CEL selectors are read when a device schema is given (the extender's claim watch gives
gpupool's, :func:`gpupool.kube.device_selector.device_schema`): a selection within the subset
:mod:`gpupool.kube.device_selector` reads is kept per request (the extender then chooses among the
cards it allows); one outside it is the ask's ``problem``, as above. The request's DeviceClass adds
its own selectors (``class_selections``, read by :mod:`gpupool.kube.device_classes`): a request's
selection is its class's selectors AND its own, as the allocator applies them; a class whose
selectors cannot be read makes the ask's ``problem`` too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.dra import COMPUTE, COMPUTE_PERCENT, MEMORY, MIB
from gpupool.core.model import GpuRequest
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.kube.device_selector import DeviceSchema, Selection, Unsupported, selection
from gpupool.kube.quantity import QuantityError, parse_quantity

MEMORY_STEP_MIB = 256
"""The request policy's memory step (docs/dra.md, "What the agent publishes"): the allocator
rounds a request up to it, so the ask does too."""
MAX_COUNT = 64
"""More cards than any node has: refused as a problem rather than modelled."""


@dataclass(frozen=True)
class ClaimAsk:
    """One claim's asks of gpupool's cards: ``(request name, GpuRequest)`` pairs, whether it is
    allocated already (then it asks nothing more: its allocation is booked), and ``problem`` when
    some request of gpupool's class cannot be modelled."""

    asks: tuple[tuple[str, GpuRequest], ...] = ()
    allocated: bool = False
    problem: str | None = None
    named: str | None = None
    """The first request naming one of gpupool's classes (:func:`class_request`), None when none
    does: whether the claim's pod is one for gpupool's scheduler (the pod-scheduler webhook)."""
    selections: tuple[tuple[str, Selection], ...] = ()
    """``(request name, its selectors)`` for the asks whose request has selectors (read only with
    a device schema)."""


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _requests(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    requests = _map(spec.get("devices")).get("requests")
    if isinstance(requests, list):
        for request in requests:
            yield _map(request)


def _memory_mib(value: object, where: str) -> int:
    try:
        mib = math.ceil(parse_quantity(value) / MIB)
    except QuantityError as exc:
        raise ValueError(f"{where}: memory: {exc}") from None
    if mib <= 0:
        raise ValueError(f"{where}: memory {value!r} is not positive")
    return math.ceil(mib / MEMORY_STEP_MIB) * MEMORY_STEP_MIB


def _compute_per_mille(value: object, where: str) -> int:
    try:
        percent = math.ceil(parse_quantity(value))
    except QuantityError as exc:
        raise ValueError(f"{where}: compute: {exc}") from None
    if not 0 <= percent <= COMPUTE_PERCENT:
        raise ValueError(f"{where}: compute {value!r} is not 0-{COMPUTE_PERCENT} percent")
    return percent * (COMPUTE_PER_CARD // COMPUTE_PERCENT)


def class_request(spec: object, classes: frozenset[str]) -> str | None:
    """The name of the first request of ``spec`` (a ResourceClaim's spec, or a ResourceClaimTemplate's
    ``spec.spec``) that asks for one of ``classes``, exactly or among its ``firstAvailable``
    alternatives; None when none does (a malformed spec asks for nothing). Never raises."""
    for request in _requests(_map(spec)):
        alternatives = request.get("firstAvailable")
        among = alternatives if isinstance(alternatives, list) else ()
        if _map(request.get("exactly")).get("deviceClassName") in classes or any(
                _map(a).get("deviceClassName") in classes for a in among):
            return str(request.get("name") or "")[:64]
    return None


def class_names(spec: object) -> frozenset[str]:
    """Every DeviceClass the requests of ``spec`` name (``exactly`` and ``firstAvailable``)."""
    names: set[str] = set()
    for request in _requests(_map(spec)):
        alternatives = request.get("firstAvailable")
        for entry in (request.get("exactly"), *(alternatives if isinstance(alternatives, list) else ())):
            name = _map(entry).get("deviceClassName")
            if isinstance(name, str):
                names.add(name)
    return frozenset(names)


def gpu_request(exactly: Mapping[str, Any], where: str) -> GpuRequest:
    """The :class:`GpuRequest` of one ``exactly`` request of gpupool's class; ``ValueError`` with
    the reason for one that cannot be modelled."""
    mode = exactly.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        raise ValueError(f"{where}: allocationMode {str(mode)[:32]!r} (only ExactCount is modelled)")
    count = exactly.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise ValueError(f"{where}: count {str(count)[:32]!r} is not 1-{MAX_COUNT}")
    capacity = _map(_map(exactly.get("capacity")).get("requests"))
    compute = _compute_per_mille(capacity[COMPUTE], where) if COMPUTE in capacity else 0
    if MEMORY not in capacity:  # the policy's default: all of the card's memory
        return GpuRequest.whole(count)
    memory = _memory_mib(capacity[MEMORY], where)
    try:
        return GpuRequest(count=count, compute=compute, memory_mib=memory)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


ClassSelection = Selection | str
"""What a DeviceClass's own selectors add to its requests' selection, or why they cannot be read."""


def _and(first: Selection | None, then: Selection | None) -> Selection | None:
    if first is None or then is None:
        return first or then
    return Selection(first.texts + then.texts, first.trees + then.trees)


def claim_ask(obj: Mapping[str, Any], classes: frozenset[str], schema: DeviceSchema | None = None,
              class_selections: Mapping[str, ClassSelection] | None = None) -> ClaimAsk:
    """What claim ``obj`` (a ResourceClaim as the API serves it) asks of the device classes in
    ``classes`` (gpupool's), with its requests' selectors read against ``schema`` (None: not read)
    and ANDed with their class's in ``class_selections`` (a class absent there adds none).
    Never raises: what cannot be read is the ask's ``problem``."""
    meta = _map(obj.get("metadata"))
    where = f"claim {meta.get('namespace', '')}/{meta.get('name', '')}"
    allocated = _map(obj.get("status")).get("allocation") is not None
    named = class_request(obj.get("spec"), classes)
    asks: list[tuple[str, GpuRequest]] = []
    selections: list[tuple[str, Selection]] = []
    for request in _requests(_map(obj.get("spec"))):
        name = str(request.get("name") or "")
        here = f"{where}, request {name[:64]!r}"
        alternatives = request.get("firstAvailable")
        if isinstance(alternatives, list) and any(_map(a).get("deviceClassName") in classes for a in alternatives):
            return ClaimAsk(allocated=allocated, problem=f"{here}: firstAvailable alternatives are not modelled",
                            named=named)
        exactly = _map(request.get("exactly"))
        device_class = exactly.get("deviceClassName")
        if device_class not in classes:
            continue
        by_class = (class_selections or {}).get(str(device_class))
        if isinstance(by_class, str):
            return ClaimAsk(allocated=allocated, named=named,
                            problem=f"{here}: DeviceClass {str(device_class)[:64]!r}: {by_class}")
        try:
            asks.append((name, gpu_request(exactly, here)))
            chosen = _and(by_class, selection(exactly.get("selectors"), schema) if schema is not None else None)
        except Unsupported as exc:
            return ClaimAsk(allocated=allocated, problem=f"{here}: selector not read: {exc}", named=named)
        except ValueError as exc:
            return ClaimAsk(allocated=allocated, problem=str(exc), named=named)
        if chosen is not None:
            selections.append((name, chosen))
    return ClaimAsk(tuple(asks), allocated, named=named, selections=tuple(selections))


def pod_claim_names(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """``(claim name in the pod, ResourceClaim name)`` for each of the pod's ``resourceClaims``; the
    second is ``""`` for a claim from a template whose claim the controller has not made yet (its
    name is in ``status.resourceClaimStatuses`` once made)."""
    made = {}
    statuses = _map(pod.get("status")).get("resourceClaimStatuses")
    for entry in statuses if isinstance(statuses, list) else ():
        entry = _map(entry)
        if entry.get("name"):
            made[str(entry["name"])] = str(entry.get("resourceClaimName") or "")
    found = []
    claims = _map(pod.get("spec")).get("resourceClaims")
    for entry in claims if isinstance(claims, list) else ():
        entry = _map(entry)
        name = str(entry.get("name") or "")
        if not name:
            continue
        direct = entry.get("resourceClaimName")
        found.append((name, str(direct) if direct else made.get(name, "")))
    return tuple(found)


def has_claims(pod: Mapping[str, Any]) -> bool:
    """Whether the pod names any ResourceClaim (of any driver)."""
    claims = _map(pod.get("spec")).get("resourceClaims")
    return isinstance(claims, list) and bool(claims)
