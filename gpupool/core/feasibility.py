"""Which cards and nodes can hold a request, vectorised over nodes, with reasons a user can act on.

The vectorised masks are what the simulator and the extender's filter evaluate for thousands of nodes;
:func:`explain_node` turns a failure on one node into a sentence ("no single card has 8138 MiB free;
largest free 4069 MiB") for the extender's ``FailedNodes``. Both read the ledger's cards through the
one card rule (:mod:`gpupool.core.card_rule`): the masks ask it which cards fit, the explanation asks
it why each card does not and only words its verdicts.
"""

from __future__ import annotations

import numpy as np

from gpupool.core import card_rule
from gpupool.core.card_rule import FIRST_BOOKING_VERDICT, CardSlots, CardUse, CardVerdict
from gpupool.core.model import CardMode, GpuKind, GpuRequest, PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.core.virtual_cards import enough_cards, one_card_mask, wants_one_card


def memory_need(state: ClusterState, request: GpuRequest, rows: IntArray) -> IntArray:
    """Memory the request takes on each card of ``rows`` (proportional requests vary per card)."""
    return card_rule.memory_need(state.card_mem_total[rows], request)


def card_slots(state: ClusterState, request: GpuRequest, rows: IntArray | int) -> CardSlots:
    """The ledger's description of the cards of ``rows`` (or of one row) and whether ``request``
    accepts them (model, kind, and its card scope)."""
    # ``take`` gathers the same rows as indexing, for less fixed cost (these run on every decision)
    model_ok = kind_ok = in_scope = None
    if request.models:
        model_ok = np.isin(state.card_model.take(rows, 0), state.model_ids(request.models))
    if request.kind is not None:
        virtual = state.card_virtual.take(rows, 0)
        kind_ok = virtual if request.kind == GpuKind.VIRTUAL else ~virtual
    if request.scope is not None:
        in_scope = state.scope_mask(request.scope).take(rows, 0)
    return CardSlots(state.card_exists.take(rows, 0), state.card_healthy.take(rows, 0), model_ok, kind_ok, in_scope)


def card_use(state: ClusterState, rows: IntArray) -> CardUse:
    """What the ledger has booked on the cards of ``rows``."""
    return CardUse(state.card_mode.take(rows, 0), state.card_mem_free.take(rows, 0),
                   state.card_compute_free.take(rows, 0))


def card_fit_mask(state: ClusterState, request: GpuRequest, rows: IntArray) -> BoolArray:
    """``[rows, cards]``: which cards can take one slice of ``request`` right now (the card rule)."""
    return card_rule.fit_mask(card_slots(state, request, rows), card_use(state, rows),
                              card_rule.demand_of(request, state.card_mem_total.take(rows, 0)))


def card_verdicts(state: ClusterState, request: GpuRequest, rows: IntArray) -> IntArray:
    """``[rows, cards]``: the :class:`CardVerdict` of every card for one slice of ``request``."""
    return card_rule.verdicts(card_slots(state, request, rows), card_use(state, rows),
                              card_rule.demand_of(request, state.card_mem_total[rows]))


def one_card_fit_mask(state: ClusterState, request: GpuRequest, rows: IntArray) -> BoolArray:
    """``[rows, cards]``: which cards can hold every slice of a virtual-card request at once (all
    False for any other request; :mod:`gpupool.core.virtual_cards`)."""
    mem_total = state.card_mem_total.take(rows, 0)
    if not wants_one_card(request):
        return np.zeros(np.shape(mem_total), dtype=bool)
    return one_card_mask(card_slots(state, request, rows), card_use(state, rows), request, mem_total)


def request_fit(state: ClusterState, request: GpuRequest, rows: IntArray) -> tuple[BoolArray, BoolArray]:
    """Rows with cards enough for ``request`` (``count`` cards, or one card for a virtual-card
    request), and the ``[rows, cards]`` mask of the cards that could serve it."""
    fits = card_fit_mask(state, request, rows)
    if not wants_one_card(request):
        return fits.sum(axis=1) >= request.count, fits
    one = one_card_fit_mask(state, request, rows)
    return enough_cards(fits, one, request), fits | one


def node_fit_mask(state: ClusterState, pod: PodRequest, rows: IntArray | None = None) -> BoolArray:
    """Nodes (of ``rows``, default all) that pass CPU, memory and per-container card counts.

    Exact for pods with at most one GPU container (the common case and every trace pod). With several
    GPU containers it is a necessary condition; :func:`gpupool.core.cards.assign_on_node` decides.
    """
    if rows is None:
        rows = np.arange(state.size, dtype=np.int64)
    ok = node_room_mask(state, pod, rows)
    for container in (*pod.containers, *pod.init_containers):
        if container.gpu is None:
            continue
        ok &= request_fit(state, container.gpu, rows)[0]
    return ok


def node_room_mask(state: ClusterState, pod: PodRequest, rows: IntArray) -> BoolArray:
    """Nodes of ``rows`` that are known and have the pod's CPU and memory free (cards not checked)."""
    ok: BoolArray = state.present.take(rows)  # a copy
    ok &= state.cpu_free.take(rows) >= pod.cpu_milli
    ok &= state.mem_free.take(rows) >= pod.memory_mib
    return ok


def request_problem(state: ClusterState, pod: PodRequest) -> str | None:
    """A reason why no node of the cluster could ever hold ``pod``, or None.

    This is the "larger than the biggest card" rule: it is reported once, up front, instead of as a
    puzzling failure on every node.
    """
    capacity = state.capacity()  # memoised per node-set change: this runs on every filter and bind
    if not capacity.has_cards:
        return "the cluster has no GPU cards" if pod.wants_gpu else None
    largest_mem = capacity.largest_card_mib
    most_cards = capacity.most_cards
    for container in (*pod.containers, *pod.init_containers):
        request = container.gpu
        if request is None:
            continue
        if request.count > most_cards and not wants_one_card(request):
            return (f"container {container.name} asks for {request.count} cards; the largest node "
                    f"has {most_cards}")
        if request.memory_mib is not None and request.memory_mib > largest_mem:
            return (f"container {container.name} asks for {request.memory_mib} MiB on one card; "
                    f"the largest card has {largest_mem} MiB")
        if request.models and not state.model_ids(request.models):
            return (f"container {container.name} asks for GPU model(s) {', '.join(sorted(request.models))}; "
                    f"the cluster has {', '.join(sorted(state.models))}")
    return None


def shape_problem(state: ClusterState, pod: PodRequest) -> str | None:
    """Why no node of the cluster could hold ``pod`` even with all its cards idle and healthy, or
    None: :func:`request_problem`'s reason, else the first GPU container for which no node has as
    many cards as it asks for that the card rule accepts (model, kind, memory and compute per card),
    e.g. four 40 GiB slices where the 40 GiB cards sit two to a node.

    Card health, bookings and the pod's card scope (groups, pools, pins) are left out: they change,
    the cards of a node do not. The admission webhooks refuse a pod with this reason; the filter
    words the same cases per node.
    """
    problem = request_problem(state, pod)
    if problem is not None:
        return problem
    rows = np.flatnonzero(state.present)
    if not len(rows):
        return None
    totals = state.card_mem_total.take(rows, 0)
    idle = CardUse(np.full_like(totals, int(CardMode.IDLE)), totals, state.card_compute_total.take(rows, 0))
    for container in (*pod.containers, *pod.init_containers):
        request = container.gpu
        if request is None:
            continue
        slots = card_slots(state, request, rows)
        slots = slots._replace(healthy=slots.exists, in_scope=None)
        fits = card_rule.fit_mask(slots, idle, card_rule.demand_of(request, totals))
        most = int(fits.sum(axis=1).max())
        if most < request.count and not one_card_mask(slots, idle, request, totals).any():
            return (f"container {container.name} asks for {request.count} cards of {_card_words(request)}; "
                    f"no node has that many such cards (at most {most})")
    return None


def _card_words(request: GpuRequest) -> str:
    """What one card of ``request`` must be, in words: ``40960 MiB, model A100``, ``a whole card``."""
    parts = ["a whole card" if request.exclusive else
             f"{request.memory_share / 10:g} percent of its memory" if request.memory_share is not None else
             f"{request.memory_mib} MiB" if request.memory_mib is not None else
             f"{request.compute / 10:g} percent of compute and memory"]
    if request.models:
        parts.append(f"model {'|'.join(sorted(request.models))}")
    if request.kind is not None:
        parts.append(f"kind {request.kind.value}")
    return ", ".join(parts)


def node_resources_problem(state: ClusterState, row: int, pod: PodRequest) -> str | None:
    """Why node ``row`` cannot hold the pod's CPU and memory (or is unknown), or None."""
    if not state.present[row]:
        return f"node {state.specs[row].name} is not known to gpupool"
    if state.cpu_free[row] < pod.cpu_milli:
        return f"insufficient CPU: {pod.cpu_milli}m requested, {int(state.cpu_free[row])}m free"
    if state.mem_free[row] < pod.memory_mib:
        return f"insufficient memory: {pod.memory_mib} MiB requested, {int(state.mem_free[row])} MiB free"
    return None


def explain_node(state: ClusterState, row: int, pod: PodRequest) -> str | None:
    """Why ``pod`` does not fit on node ``row`` now, in words; None if it fits (as far as counts go)."""
    problem = node_resources_problem(state, row, pod)
    if problem is not None:
        return problem
    for container in (*pod.containers, *pod.init_containers):
        if container.gpu is not None:
            problem = explain_cards(state, row, container.gpu)
            if problem is not None:
                return problem
    return None


def explain_cards(state: ClusterState, row: int, request: GpuRequest) -> str | None:
    """Why node ``row`` has fewer than ``request.count`` cards that take a slice, from their verdicts.

    The sentence names the first thing the cards lack, in the order of the card rule: an accepted
    healthy card, then an idle card (whole cards) or the memory and then the compute (slices).
    """
    rows = np.array([row], dtype=np.int64)
    codes = card_verdicts(state, request, rows)[0]
    if int((codes == CardVerdict.FITS).sum()) >= request.count or one_card_fit_mask(state, request, rows).any():
        return None
    eligible = codes >= FIRST_BOOKING_VERDICT
    eligible |= codes == CardVerdict.FITS
    if not eligible.any():
        if request.scope is not None and (codes == CardVerdict.OUT_OF_SCOPE).any():
            return f"no healthy card of the requested kind within {request.scope.label} on this node"
        if request.models:
            have = sorted({state.models[m] for m in state.card_model[row] if m >= 0})
            return (f"no healthy card of model {'|'.join(sorted(request.models))} "
                    f"(node has {', '.join(have) or 'no cards'})")
        return "no healthy card of the requested kind"
    if request.exclusive:
        idle = int((codes == CardVerdict.FITS).sum())
        return f"needs {request.count} idle whole card(s); {idle} idle"
    shareable = eligible & (codes != CardVerdict.EXCLUSIVE_HELD)
    has_memory = (codes == CardVerdict.FITS) | (codes == CardVerdict.NO_COMPUTE)
    if int(has_memory.sum()) < request.count:
        need = memory_need(state, request, rows)[0]
        largest = int(state.card_mem_free[row][shareable].max()) if shareable.any() else 0
        wanted = int(need[shareable].min()) if shareable.any() else int(need.max())
        if request.count == 1:
            return f"no single card has {wanted} MiB free; largest free {max(largest, 0)} MiB"
        return f"fewer than {request.count} cards have {wanted} MiB free; largest free {max(largest, 0)} MiB"
    best_compute = int(state.card_compute_free[row][shareable].max())
    # "percent", never a "%" sign: kube-scheduler formats a reason with Go's fmt (docs/extender.md, "API")
    return (f"no card has {request.compute / 10:g} percent compute free together with the memory; "
            f"largest free compute {max(best_compute, 0) / 10:g} percent")
