"""Nodes and pods read once from the API → a core ledger holding what every pod holds, as the extender books it.

Why a snapshot and not the extender's cache: the plugin runs once and exits, it has no watch, no
binds in flight and no clock of pins, and it may not import the extender (``.importlinter``). It
uses the same translation (:func:`gpupool.kube.translate.node_spec`, :func:`pod_request`, the
annotation codecs) and books with :meth:`ClusterState.claim`, so cards, holders and free space are
the extender's. The rule for what a pod holds is the watch side of the extender's booking table
(:func:`gpupool.extender.bookings.observe`) without pins, which live only inside the extender:

* a finished pod (``Succeeded``/``Failed``) holds nothing;
* a pod with a readable assignment for the node it is bound to (or not bound yet) holds the cards
  it names, plus its CPU and memory there; one assigned but not bound and not confirmed by the node
  agent for longer than the extender's unconfirmed timeout holds nothing (the extender let it go);
* any other bound pod holds its CPU and memory only; if its assignment cannot be read (or names
  cards the node does not have), the node takes no GPU pod, as in the extender.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.annotations import AnnotationError, Assignment, decode_allocated, decode_assignment
from gpupool.api.names import ResourceNames
from gpupool.core.model import NodeSpec, Placement, PodRequest
from gpupool.core.state import AllocationError, ClusterState
from gpupool.kube.translate import TranslationError, node_spec, pod_key, pod_request

UNCONFIRMED_TIMEOUT_S = 300.0
"""The extender's default ``--unconfirmed-timeout``: how long an assignment without a binding holds its cards."""

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
"""Phases whose containers have stopped for good: the pod holds nothing any more."""


@dataclass(frozen=True)
class ClusterSnapshot:
    """The ledger built from one read of the cluster, and what could not be read into it.

    ``node_problems``: per node, why gpupool places no GPU pod there (an inventory it cannot read,
    a bound pod whose assignment it cannot read). ``pod_problems``: per pod (``namespace/name``),
    why its request or booking could not be read. ``unbound``: pods holding cards by an assignment
    whose binding has not happened yet (a bind in flight). ``listed``: per node, the resource names
    its kubelet lists in capacity or allocatable (which foreign aliases it serves). ``requests``: the readable requests
    of the pods read, for the workload profile of fragmentation-aware policies.
    """

    state: ClusterState
    node_problems: Mapping[str, str]
    pod_problems: Mapping[str, str]
    unbound: frozenset[str]
    listed: Mapping[str, frozenset[str]]
    requests: tuple[PodRequest, ...] = ()


def build_snapshot(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                   names: ResourceNames, *, now: float, leave_out: frozenset[str] = frozenset()) -> ClusterSnapshot:
    """Book ``pods`` on ``nodes`` (API JSON dicts) at time ``now`` (epoch seconds).

    ``leave_out``: pods (``namespace/name``) not booked, e.g. the pod being explained, whose own
    earlier assignment must not stand in its way (the extender lifts it too before deciding again).
    """
    specs: list[NodeSpec] = []
    node_problems: dict[str, str] = {}
    listed: dict[str, frozenset[str]] = {}
    for raw in nodes:
        meta = raw.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name:
            continue
        try:
            specs.append(node_spec(raw, names))
        except TranslationError as exc:
            specs.append(NodeSpec(name=name, cpu_milli=0, memory_mib=0))
            node_problems[name] = str(exc)
        status = raw.get("status") or {}
        listed[name] = frozenset({**(status.get("capacity") or {}), **(status.get("allocatable") or {})})
    state = ClusterState(specs)
    pod_problems: dict[str, str] = {}
    unbound: set[str] = set()
    requests: list[PodRequest] = []
    for raw in pods:
        booking = _booking(raw, names, state, now)
        if booking is None or booking.key in leave_out:
            continue
        if booking.request is not None:
            requests.append(booking.request)
        if booking.problem is not None:
            pod_problems[booking.key] = booking.problem
            if booking.refuses_node:
                node_problems.setdefault(booking.placement.node if booking.placement else "",
                                         _refusal(booking.key, booking.problem))
        if booking.placement is None:
            continue
        try:
            state.claim(booking.placement)
        except AllocationError as exc:
            pod_problems[booking.key] = f"cannot book its assignment: {exc}"
            continue
        if not booking.bound:
            unbound.add(booking.key)
    node_problems.pop("", None)
    return ClusterSnapshot(state=state, node_problems=node_problems, pod_problems=pod_problems,
                           unbound=frozenset(unbound), listed=listed,
                           requests=tuple(requests))


def _refusal(key: str, problem: str) -> str:
    """The extender's sentence for a node refused because of an unreadable claim."""
    return (f"pod {key} is bound to this node with an assignment gpupool cannot read ({problem}); its cards "
            "are unknown, so no GPU pod is placed here until it is fixed or the pod ends")


@dataclass(frozen=True)
class _Booking:
    key: str
    placement: Placement | None
    bound: bool
    request: PodRequest | None
    problem: str | None = None
    refuses_node: bool = False


def _spec_of(state: ClusterState, name: str) -> NodeSpec | None:
    row = state.index.get(name)
    return state.specs[row] if row is not None and state.present[row] else None


def _booking(raw: Mapping[str, Any], names: ResourceNames, state: ClusterState, now: float) -> _Booking | None:
    """What one pod holds (see the module docstring), or None for a pod that holds nothing."""
    meta = raw.get("metadata") or {}
    status = raw.get("status") or {}
    if status.get("phase") in FINISHED_PHASES:
        return None
    try:
        key = pod_key(raw)
    except TranslationError:
        return None
    bound = str((raw.get("spec") or {}).get("nodeName") or "")
    annotations = meta.get("annotations") or {}
    problem: str | None = None
    request: PodRequest | None = None
    cpu = memory = 0
    try:
        request = pod_request(raw, names)
        cpu, memory = request.cpu_milli, request.memory_mib
    except TranslationError as exc:
        problem = str(exc)
    assignment: Assignment | None = None
    text = annotations.get(names.assignment)
    if text is not None:
        try:
            assignment = decode_assignment(text)
        except AnnotationError as exc:
            problem = str(exc)
    host_only = Placement(pod_key=key, node=bound, cpu_milli=cpu, memory_mib=memory)
    if assignment is None or (bound and bound != assignment.node):
        if not bound or _spec_of(state, bound) is None:
            return _Booking(key, None, bool(bound), request, problem)
        return _Booking(key, host_only, True, request, problem, refuses_node=text is not None and assignment is None)
    if not bound and not _allocated(annotations, names, assignment) and \
            now - assignment.time.timestamp() > UNCONFIRMED_TIMEOUT_S:
        return None
    spec = _spec_of(state, assignment.node)
    if spec is None:
        return _Booking(key, None, bool(bound), request, problem)
    try:
        placement = assignment.to_placement(key, spec, cpu, memory)
    except AnnotationError as exc:
        return _Booking(key, host_only if bound else None, bool(bound), request, str(exc),
                        refuses_node=bool(bound))
    return _Booking(key, placement, bool(bound), request, problem)


def _allocated(annotations: Mapping[str, Any], names: ResourceNames, assignment: Assignment) -> bool:
    """Whether the node agent confirmed the assignment (``allocated-v1`` for the same node)."""
    text = annotations.get(names.allocated)
    if text is None:
        return False
    try:
        return decode_allocated(text).node == assignment.node
    except AnnotationError:
        return False
