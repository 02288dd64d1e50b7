"""Nodes and pods read once from the API → a core ledger holding what every pod holds, as the extender books it.

Why a snapshot and not the extender's cache: the plugin runs once and exits, it has no watch, no
binds in flight and no clock of pins, and it may not import the extender (``.importlinter``). It
uses the same translation (:func:`gpupool.kube.translate.node_spec`, the annotation codecs) and
books with :meth:`ClusterState.claim`, so cards, holders and free space are the extender's. What a
pod holds is the rule the extender books by, from the same module
(:func:`gpupool.kube.pod_holding.holding`), without pins, which live only inside the extender:
finished pods and assignments expired unconfirmed hold nothing and are left out; a pod whose
assignment cannot be used on the node it is bound to refuses that node to GPU pods, as in the
extender.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.api.cluster_settings import DEFAULT_UNCONFIRMED_TIMEOUT_S
from gpupool.api.dra import driver_name
from gpupool.api.enforcement import EnforcementNoticeError
from gpupool.api.names import ResourceNames
from gpupool.core.model import NodeSpec, Placement, PodRequest
from gpupool.core.state import AllocationError, ClusterState
from gpupool.kube.claim_holding import claim_booking, read_claim
from gpupool.kube.node_enforcement import node_notice, refusal_of, unreadable_refusal
from gpupool.kube.pod_holding import HoldingKind, holding, pod_record
from gpupool.kube.translate import TranslationError, node_spec
from gpupool.kubectl.agent_checks import checks_trouble
from gpupool.kubectl.claim_users import ClaimUsers


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
    enforcement: Mapping[str, str] = field(default_factory=dict)
    """Per node that does not enforce its GPU shares, what it says (``kubectl gpupool inspect`` shows
    it): shares unenforced by the admin's choice, or whole cards only because nothing can enforce."""
    share_refusals: Mapping[str, str] = field(default_factory=dict)
    """Per node that takes whole GPUs only, the extender's reason for refusing a slice there."""
    agent_checks: Mapping[str, str] = field(default_factory=dict)
    """Per node whose agent's start-up checks were not all ok, their summary as the agent left it."""
    remote: Mapping[str, str] = field(default_factory=dict)
    """Pods (``namespace/name``) holding a remote share: the slice is booked on a card of the GPU
    server's node, the pod runs on the node given here ("" while it is not bound yet)."""
    claim_users: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Per booked DRA claim (``namespace/claim:name``), the containers that got their share through
    it (``namespace/pod/container``; :mod:`gpupool.kubectl.claim_users`); absent when none is known."""


def build_snapshot(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                   names: ResourceNames, *, now: float, leave_out: frozenset[str] = frozenset(),
                   claims: Iterable[Mapping[str, Any]] = (),
                   unconfirmed_timeout_s: float = DEFAULT_UNCONFIRMED_TIMEOUT_S) -> ClusterSnapshot:
    """Book ``pods`` on ``nodes`` (API JSON dicts) at time ``now`` (epoch seconds), and beside them
    the ResourceClaims allocated from gpupool's DRA driver (``claims``, as the extender books them:
    :mod:`gpupool.kube.claim_holding`), so a card a claim holds is never shown free.

    ``leave_out``: pods (``namespace/name``) not booked, e.g. the pod being explained, whose own
    earlier assignment must not stand in its way (the extender lifts it too before deciding again).
    ``unconfirmed_timeout_s``: the cluster's ``unconfirmedTimeout`` (docs/cluster-config.md), how long
    the extender lets an assignment whose pod was never bound hold its cards.
    """
    specs: list[NodeSpec] = []
    node_problems: dict[str, str] = {}
    listed: dict[str, frozenset[str]] = {}
    enforcement: dict[str, str] = {}
    share_refusals: dict[str, str] = {}
    agent_checks: dict[str, str] = {}
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
        _read_enforcement(raw, name, names, enforcement, share_refusals)
        trouble = checks_trouble(raw)
        if trouble is not None:
            agent_checks[name] = trouble
        status = raw.get("status") or {}
        listed[name] = frozenset({**(status.get("capacity") or {}), **(status.get("allocatable") or {})})
    state = ClusterState(specs)
    pod_problems: dict[str, str] = {}
    unbound: set[str] = set()
    remote: dict[str, str] = {}
    requests: list[PodRequest] = []
    pods = list(pods)
    for raw in pods:
        booking = _booking(raw, names, state, now, unconfirmed_timeout_s)
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
        if booking.runs_on is not None:
            remote[booking.key] = booking.runs_on
    claim_users = _book_claims(claims, driver_name(names.domain), state, node_problems, pod_problems,
                               ClaimUsers(pods))
    node_problems.pop("", None)
    return ClusterSnapshot(state=state, node_problems=node_problems, pod_problems=pod_problems,
                           unbound=frozenset(unbound), listed=listed,
                           requests=tuple(requests), enforcement=enforcement, share_refusals=share_refusals,
                           agent_checks=agent_checks, remote=remote, claim_users=claim_users)


def _book_claims(claims: Iterable[Mapping[str, Any]], driver: str, state: ClusterState,
                 node_problems: dict[str, str], pod_problems: dict[str, str],
                 users: ClaimUsers) -> dict[str, tuple[str, ...]]:
    """Book each claim allocated from ``driver`` on the node its pool names (a claim whose node is
    not in the ledger holds nothing here, as in the extender). One whose allocation cannot be read
    refuses its node, with the extender's sentence; its key (``namespace/claim:name``) is listed
    among the pod problems. Returns the containers using each booked claim (where any is known)."""
    used_by: dict[str, tuple[str, ...]] = {}
    for obj in claims:
        record = read_claim(obj, driver)
        if record is None:
            continue
        placement, problem = claim_booking(record, _spec_of(state, record.node) if record.node else None)
        if problem is not None:
            pod_problems[record.key] = problem
            node_problems.setdefault(record.node, _refusal(record.key, problem))
            continue
        if placement is not None:
            try:
                state.claim(placement)
            except AllocationError as exc:
                pod_problems[record.key] = f"cannot book its allocation: {exc}"
                continue
            found = users.of(record.key, record.users)
            if found:
                used_by[record.key] = found
    return used_by


def _read_enforcement(raw: Mapping[str, Any], name: str, names: ResourceNames,
                      enforcement: dict[str, str], share_refusals: dict[str, str]) -> None:
    """Note what a node that does not enforce its shares says, and whether slices are refused there
    (the annotation decoded once for both)."""
    try:
        notice = node_notice(raw, names)
    except EnforcementNoticeError as exc:
        enforcement[name] = f"unreadable {names.enforcement} annotation ({exc})"
        share_refusals[name] = unreadable_refusal(names, exc)
        return
    refusal = refusal_of(notice)
    if refusal is not None:
        share_refusals[name] = refusal
    if notice is not None and not notice.enforcing:
        enforcement[name] = notice.shown()


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
    runs_on: str | None = None
    """For a remote share, the node the pod runs on ("" before its bind); None for any other pod."""


def _spec_of(state: ClusterState, name: str) -> NodeSpec | None:
    row = state.index.get(name)
    return state.specs[row] if row is not None and state.present[row] else None


def _booking(raw: Mapping[str, Any], names: ResourceNames, state: ClusterState, now: float,
             unconfirmed_timeout_s: float) -> _Booking | None:
    """What one pod holds (the shared rule, :func:`gpupool.kube.pod_holding.holding`), or None for a
    pod that finished or whose unconfirmed assignment expired."""
    record = pod_record(raw, names)
    if record is None or record.finished:
        return None
    held = holding(record, lambda name: _spec_of(state, name), now=now, unconfirmed_timeout_s=unconfirmed_timeout_s)
    if held.kind is HoldingKind.EXPIRED:
        return None
    problem = held.problem if held.problem is not None else record.request_problem
    return _Booking(record.key, held.placement, held.bound, record.request, problem,
                    refuses_node=held.kind is HoldingKind.UNREADABLE,
                    runs_on=record.node_name if record.remote else None)
