"""Replaying a loaded cluster with and without idle-GPU lending (the Huanrong patent, claims 1, 5, 6).

Pods arrive, wait in one queue ordered by request time (the earliest request is tried first), and
run for their lifetime. With lending on, a running pod whose GPUs are idle (by the monitor's rule,
see :mod:`gpupool.sim.idle_model`) lends them: a waiting pod that fits nowhere on free capacity may
run on them as a borrower. When the owner is busy again, the borrowers in its way are reclaimed
(the most recently started first), record their progress and go back to the queue at their original
place; they resume where they stopped (the checkpoint protocol).

Two ledgers keep the books, both :class:`~gpupool.core.state.ClusterState` with the core's one card
rule, both placed into by the core's :class:`~gpupool.core.scheduler.Scheduler`:

* ``owned``: every running regular pod with everything it holds. Regular placements are decided
  here, so a regular pod never takes capacity that an idle owner will want back.
* ``lent`` (lending only): regular pods' CPU and memory, the GPUs of owners that are busy, and the
  borrowers. Borrowers are decided here. A regular pod's booking (or an owner's return) that does
  not fit reclaims borrowers on that node until it does; since ``lent`` minus its borrowers is never
  more than ``owned``, that always ends.

With ``remote_borrow`` (remote GPUs, docs/remote-gpu.md) a waiting pod that finds no room on free
capacity nor on lent GPUs of one node may run on a node B with room for its CPU and memory while its
one GPU slice is booked on another node's card (lent or free) and reached over the network. Both the
node B and the card are the cluster's choice: the core's :mod:`gpupool.core.remote_share` (which
nodes may run such a pod, then the pod's own cards, the same switch, any other). The borrower holds
two parts in ``lent`` (its CPU and memory on B, its slice on the server), is listed as a borrower on
both nodes (a regular pod or a returning owner on either reclaims it, releasing both parts), and its
work advances at :data:`REMOTE_RATE` of the local rate.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import IntEnum

import numpy as np

from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import NodeSpec, Placement, PodRequest
from gpupool.core.policies import make_policy
from gpupool.core.remote_share import RemoteChoice, Tier, client_scores, place_share, remote_shape_problem
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from gpupool.sim.arrivals import ArrivingPod

QUEUE_TRIES = 32
"""Scheduling attempts per ledger after each event that frees capacity. A pod asking for more GPU
than the ledger has free costs no attempt; the cap bounds the cost of a long queue on a saturated
cluster (later pods get the next event)."""

FEW_NODES = 4
"""Nodes that gained room up to which a shape that fit nowhere is tried on them alone."""

REMOTE_SLOWDOWN = 0.08
"""How much slower a compute-bound job runs on a GPU reached over the network: issue 25's anchor
(LUPINE, the successor of SCUDA, publishes compute-bound work about 8 % slower over GPU-over-IP).
Sync-heavy programs fare far worse (3-17x until calls are batched); the replay models the
compute-bound case only."""

REMOTE_RATE = 1.0 - REMOTE_SLOWDOWN
"""Seconds of a pod's work done per second it runs as a remote borrower."""

_HOUR = 3600.0


class _Event(IntEnum):
    """Kinds of events; at equal times the lower value goes first (departures free room before arrivals)."""

    FINISH = 0
    OWNER_BUSY = 1
    OWNER_IDLE = 2
    ARRIVE = 3


class _Status(IntEnum):
    WAITING = 0
    REGULAR = 1
    BORROWER = 2
    DONE = 3


@dataclass(frozen=True)
class ReplayOutcome:
    """What one replay (with or without lending) measured over its horizon."""

    lending: bool
    pods: int
    finished: int
    still_waiting: int
    allocated_gpu_hours: float  # held by regular pods (owners, idle or not)
    borrowed_gpu_hours: float  # served to borrowers on lent GPUs
    mean_wait_hours: float  # arrival to first start; pods never started count up to the horizon
    p95_wait_hours: float
    lends: int  # idle windows in which an owner lent its GPUs
    reclaims: int  # borrowers stopped because their owner (or a regular pod) needed the GPUs
    lent_gpu_hours: float = 0.0  # GPUs x time owners lent (their idle windows past the monitor's threshold)
    resume_wait_hours: float = 0.0  # reclaimed borrowers' time back in the queue before running again
    remote_borrow: bool = False
    remote_starts: int = 0  # borrower starts with the slice on another node's card than the pod's
    remote_borrowers: int = 0  # pods that ran remotely at least once
    remote_gpu_hours: float = 0.0  # GPU-hours the remote borrowers' slices were held (wall time)
    """``borrowed_gpu_hours`` counts a remote borrower's GPU-hours as the work done
    (:data:`REMOTE_RATE` of the time held): what the cluster gained, after the network's cost."""


class _NoRoom:
    """Request shapes that found no room on a ledger, and the nodes that gained room since.

    Between two attempts a ledger only gains room where something was released; a shape that fit
    nowhere can fit only there. When one or a few nodes gained room the shape is tried on them
    alone (the policy would have no other node to choose from); when none did, not at all.
    """

    def __init__(self) -> None:
        self.released: list[str] = []
        self.failed_at: dict[int, int] = {}  # shape number -> length of ``released`` then

    def gained_room(self, node: str) -> None:
        self.released.append(node)

    def found_none(self, shape: int) -> None:
        self.failed_at[shape] = len(self.released)

    def nodes_to_try(self, shape: int) -> tuple[str, ...] | None:
        """The nodes worth trying: all (None), a few, or none (an empty tuple)."""
        since = self.failed_at.get(shape)
        if since is None:
            return None
        if since == len(self.released):
            return ()
        fresh = set(self.released[since:])
        if len(fresh) > FEW_NODES:
            return None
        return tuple(sorted(fresh))


class _Replay:
    """One run over a fixed workload; see the module docstring for the two ledgers."""

    def __init__(self, nodes: Sequence[NodeSpec], pods: Sequence[ArrivingPod], policy: str, *,
                 lending: bool, hours: float, seed: int, remote_borrow: bool = False) -> None:
        if remote_borrow and not lending:
            raise ValueError("remote borrowing borrows: it needs lending")
        self.pods = pods
        self.lending = lending
        # the core runs a remote share's pod on a GPU node only with its own cards: without a node
        # lacking GPUs there is no remote placement to look for
        self.remote_borrow = remote_borrow and any(not n.cards for n in nodes)
        self.horizon = hours * _HOUR
        profile = WorkloadProfile.from_pods([p.request for p in pods])
        self.owned = ClusterState(nodes)
        self.lent = ClusterState(nodes)
        rng = np.random.default_rng(seed)
        tie_rank = rng.permutation(self.owned.size).astype(np.int64)
        self.owned_scheduler = Scheduler(self.owned, make_policy(policy, rng), profile=profile,
                                         tie_rank=tie_rank, rng=rng)
        self.lent_scheduler = Scheduler(self.lent, make_policy(policy, rng), profile=profile,
                                        tie_rank=tie_rank, rng=rng)
        count = len(pods)
        numbers: dict[tuple[object, ...], int] = {}
        self.shapes = [numbers.setdefault((p.request.containers, p.request.init_containers), len(numbers))
                       for p in pods]
        self.status = [_Status.WAITING] * count
        self.remaining = [p.duration_s for p in pods]
        self.run_start = [0.0] * count
        self.first_start: list[float | None] = [None] * count
        self.epoch = [0] * count
        self.idle_now = [False] * count
        self.placements: dict[int, Placement] = {}
        self.borrowers_on: dict[str, list[int]] = {}
        self.waiting: dict[int, list[tuple[float, int]]] = {}  # shape -> (request time, pod), earliest first
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, pod, epoch)
        self.gpu_hours = {_Status.REGULAR: 0.0, _Status.BORROWER: 0.0}
        cards = float(sum(len(n.cards) for n in nodes))
        self.free_gpus = {False: cards, True: cards}  # per ledger (lent: True), to skip hopeless tries
        self.no_room = {False: _NoRoom(), True: _NoRoom()}
        self.lends = self.reclaims = self.finished = 0
        self.lent_since: dict[int, float] = {}  # owner -> start of its current lent window
        self.lent_gpu_hours = 0.0
        self.reclaimed_at: dict[int, float] = {}  # borrower -> when it was reclaimed (until it runs again)
        self.resume_wait_hours = 0.0
        self.asked_remote = remote_borrow
        self.remote_host: dict[int, Placement] = {}  # remote borrower -> its CPU and memory on its node
        self.remote_no_room = _NoRoom()  # shapes no remote placement was found for (any node counts)
        self.remote_shapes_ok: dict[int, bool] = {}  # shape -> whether a remote share can carry it
        self.remote_starts = 0
        self.remote_ran: set[int] = set()
        self.remote_gpu_hours = 0.0

    # ------------------------------------------------------------------------------------ the loop
    def run(self) -> ReplayOutcome:
        for position, pod in enumerate(self.pods):
            self.events.append((pod.arrival_s, _Event.ARRIVE, position, 0))
        heapq.heapify(self.events)
        while self.events and self.events[0][0] <= self.horizon:
            time, kind, position, epoch = heapq.heappop(self.events)
            if epoch != self.epoch[position]:
                continue  # the pod was reclaimed or finished since this event was planned
            if kind == _Event.ARRIVE:
                self._wait(position)
            elif kind == _Event.FINISH:
                self._finish(position, time)
            elif kind == _Event.OWNER_IDLE:
                self._lend(position, time)
            else:
                self._take_back(position, time)  # reclaimed borrowers may fit elsewhere
            self._serve_queue(time)
        for position, status in enumerate(self.status):
            if status in (_Status.REGULAR, _Status.BORROWER):
                self._account(position, self.horizon)
            self._end_lent_window(position, self.horizon)
        return self._outcome()

    # ----------------------------------------------------------------------------------- transitions
    def _serve_queue(self, now: float) -> None:
        """Try waiting pods, earliest request first: on free capacity, else (lending) on lent GPUs.

        Pods of one shape are interchangeable, so each pass looks at the earliest waiting pod of each
        shape and moves on to the next shape when it does not fit. A shape that found no room is
        tried again only on the nodes that gained room since (see :class:`_NoRoom`); attempts are
        capped per pass (:data:`QUEUE_TRIES`).
        """
        ledgers = (False, True) if self.lending else (False,)
        tries = dict.fromkeys(ledgers, 0)
        for _, shape in sorted((line[0][0], shape) for shape, line in self.waiting.items() if line):
            line = self.waiting[shape]
            while line and self._start_first(line, shape, ledgers, tries, now):
                pass
            if all(t >= QUEUE_TRIES for t in tries.values()):
                return

    def _start_first(self, line: list[tuple[float, int]], shape: int, ledgers: tuple[bool, ...],
                     tries: dict[bool, int], now: float) -> bool:
        """Start the earliest waiting pod of a shape if any ledger has room; whether it started."""
        position = line[0][1]
        pod = self.pods[position]
        for lent in ledgers:
            if tries[lent] >= QUEUE_TRIES or pod.gpus > self.free_gpus[lent]:
                continue
            nodes = self.no_room[lent].nodes_to_try(shape)
            if nodes == ():
                continue
            tries[lent] += 1
            decision = self._place(lent, pod, nodes)
            if decision is None:
                self.no_room[lent].found_none(shape)
                continue
            line.pop(0)
            (self._start_borrower if lent else self._start_regular)(position, decision, now)
            return True
        if self.remote_borrow and tries[True] < QUEUE_TRIES and pod.gpus <= self.free_gpus[True]:
            return self._start_remote(line, shape, tries, now)
        return False

    def _start_remote(self, line: list[tuple[float, int]], shape: int, tries: dict[bool, int], now: float) -> bool:
        """Start the earliest waiting pod of a shape as a remote borrower if the core finds it a place."""
        position = line[0][1]
        if not self._remote_shape(shape, position) or self.remote_no_room.nodes_to_try(shape) == ():
            return False
        tries[True] += 1
        placed = self._place_remote(self.pods[position].request)
        if placed is None:
            self.remote_no_room.found_none(shape)
            return False
        line.pop(0)
        host, share = placed
        self.lent.apply(host)
        self.lent.apply(share)
        self.remote_host[position] = host
        self._start_borrower(position, share, now)
        self.borrowers_on.setdefault(host.node, []).append(position)
        self.remote_starts += 1
        self.remote_ran.add(position)
        return True

    def _remote_shape(self, shape: int, position: int) -> bool:
        known = self.remote_shapes_ok.get(shape)
        if known is None:
            request = self.pods[position].request
            # One card only: the replay's remote borrowers (and docs/lending.md's figures of them) are
            # of one-card shares; the extender's shares of several cards of one node are not replayed.
            known = self.remote_shapes_ok[shape] = remote_shape_problem(request) is None and all(
                c.gpu is None or c.gpu.count == 1 for c in request.containers)
        return known

    def _place_remote(self, request: PodRequest) -> tuple[Placement, Placement] | None:
        """The cluster's choice for a remote share in the lent ledger: the node that runs the pod (the
        best tier :func:`~gpupool.core.remote_share.client_scores` gives, then the node name) and the
        card of its slice (:func:`~gpupool.core.remote_share.place_share`); None when there is none.
        A choice on the pod's own cards is a local share, which the lent scheduler already tried."""
        state = self.lent
        rows, scores = client_scores(state, request, np.flatnonzero(state.present[:state.size]))
        for index in np.lexsort((np.array([state.specs[r].name for r in rows], dtype=object), -scores)):
            choice = place_share(state, request, int(rows[index]))
            if isinstance(choice, RemoteChoice) and choice.tier != Tier.LOCAL:
                host = Placement(pod_key=f"{request.key}#host", node=state.specs[int(rows[index])].name,
                                 cpu_milli=request.cpu_milli, memory_mib=request.memory_mib)
                return host, choice.placement
        return None

    def _place(self, lent: bool, pod: ArrivingPod, nodes: tuple[str, ...] | None) -> Placement | None:
        """Book ``pod`` where the policy puts it; on ``nodes`` only when all others are known full."""
        scheduler = self.lent_scheduler if lent else self.owned_scheduler
        if nodes is None:
            decision = scheduler.schedule(pod.request)
            return decision if isinstance(decision, Placement) else None
        state = scheduler.state
        request = pod.request
        for node in nodes:
            row = state.index[node]
            if (state.cpu_free[row] < request.cpu_milli or state.mem_free[row] < request.memory_mib
                    or state.card_compute_free[row].sum() < request.gpu_milli_total()):
                continue  # the quick sums say no; assign() would say so at greater cost
            decision = scheduler.assign(request, node)
            if isinstance(decision, Placement):
                scheduler.state.apply(decision)
                return decision
        return None

    def _wait(self, position: int) -> None:
        bisect.insort(self.waiting.setdefault(self.shapes[position], []), (self.pods[position].arrival_s, position))

    def _release(self, lent: bool, key: str) -> Placement | None:
        placement = (self.lent if lent else self.owned).release(key)
        if placement is not None:
            self.no_room[lent].gained_room(placement.node)
            if lent:
                self.remote_no_room.gained_room(placement.node)
        return placement

    def _start_regular(self, position: int, placement: Placement, now: float) -> None:
        self._started(position, placement, _Status.REGULAR, now)
        self.free_gpus[False] -= self.pods[position].gpus
        if self.lending:
            host, gpus = _split(placement)
            self._book_lent(host, now)
            self._book_lent(gpus, now)
            self.free_gpus[True] -= self.pods[position].gpus
            done = self.pods[position].duration_s - self.remaining[position]
            for start, end in self.pods[position].lendable:
                if end > done:
                    self._plan(now + max(start, done) - done, _Event.OWNER_IDLE, position)
                    self._plan(now + end - done, _Event.OWNER_BUSY, position)

    def _start_borrower(self, position: int, placement: Placement, now: float) -> None:
        self._started(position, placement, _Status.BORROWER, now)
        self.free_gpus[True] -= self.pods[position].gpus
        self.borrowers_on.setdefault(placement.node, []).append(position)

    def _started(self, position: int, placement: Placement, status: _Status, now: float) -> None:
        reclaimed = self.reclaimed_at.pop(position, None)
        if reclaimed is not None:
            self.resume_wait_hours += (now - reclaimed) / _HOUR
        self.status[position] = status
        self.placements[position] = placement
        self.run_start[position] = now
        if self.first_start[position] is None:
            self.first_start[position] = now
        self._plan(now + self.remaining[position] / self._rate(position), _Event.FINISH, position)

    def _finish(self, position: int, now: float) -> None:
        self._account(position, now)
        self._end_lent_window(position, now)
        key = self.pods[position].request.key
        if self.status[position] == _Status.REGULAR:
            self._release(False, key)
            self.free_gpus[False] += self.pods[position].gpus
            if self.lending:
                self._release(True, f"{key}#host")
                if self._release(True, f"{key}#gpu") is not None:
                    self.free_gpus[True] += self.pods[position].gpus
        else:
            self._unbook_borrower(position)
        self.status[position] = _Status.DONE
        self.epoch[position] += 1
        self.finished += 1

    def _lend(self, position: int, now: float) -> None:
        if self.status[position] != _Status.REGULAR or self.idle_now[position]:
            return
        if self._release(True, f"{self.pods[position].request.key}#gpu") is not None:
            self.idle_now[position] = True
            self.free_gpus[True] += self.pods[position].gpus
            self.lends += 1
            self.lent_since[position] = now

    def _end_lent_window(self, position: int, now: float) -> None:
        """Count the GPU-hours an owner's window offered, whether borrowers used them or not."""
        since = self.lent_since.pop(position, None)
        if since is not None:
            self.lent_gpu_hours += self.pods[position].gpus * (min(now, self.horizon) - since) / _HOUR

    def _take_back(self, position: int, now: float) -> None:
        if self.status[position] != _Status.REGULAR or not self.idle_now[position]:
            return
        self.idle_now[position] = False
        self._end_lent_window(position, now)
        self._book_lent(_split(self.placements[position])[1], now)
        self.free_gpus[True] -= self.pods[position].gpus

    def _book_lent(self, part: Placement, now: float) -> None:
        """Book a regular pod's part in the lent ledger, reclaiming borrowers in its way."""
        while (reason := self.lent.check(part)) is not None:
            in_way = self.borrowers_on.get(part.node)
            if not in_way:
                raise RuntimeError(f"lent ledger holds more than the owned one on {part.node}: {reason}")
            self._reclaim(in_way[-1], now)
        self.lent.apply(part)

    def _rate(self, position: int) -> float:
        """Seconds of work per second of running: :data:`REMOTE_RATE` for a remote borrower, else 1."""
        return REMOTE_RATE if position in self.remote_host else 1.0

    def _reclaim(self, position: int, now: float) -> None:
        self._account(position, now)
        self.remaining[position] -= (now - self.run_start[position]) * self._rate(position)
        self._unbook_borrower(position)
        self.status[position] = _Status.WAITING
        self.epoch[position] += 1
        self.reclaims += 1
        self.reclaimed_at[position] = now
        self._wait(position)

    def _unbook_borrower(self, position: int) -> None:
        """Release everything a borrower holds: its booking, and a remote borrower's CPU and memory."""
        placement = self.placements.pop(position)
        self._release(True, placement.pod_key)
        self.borrowers_on[placement.node].remove(position)
        host = self.remote_host.pop(position, None)
        if host is not None:
            self._release(True, host.pod_key)
            self.borrowers_on[host.node].remove(position)
        self.free_gpus[True] += self.pods[position].gpus

    # ------------------------------------------------------------------------------------ accounting
    def _plan(self, time: float, kind: _Event, position: int) -> None:
        heapq.heappush(self.events, (time, kind, position, self.epoch[position]))

    def _account(self, position: int, until: float) -> None:
        held = self.pods[position].gpus * (min(until, self.horizon) - self.run_start[position]) / _HOUR
        if position in self.remote_host:
            self.remote_gpu_hours += held
        self.gpu_hours[_Status(self.status[position])] += held * self._rate(position)

    def _outcome(self) -> ReplayOutcome:
        arrived = [i for i, p in enumerate(self.pods) if p.arrival_s <= self.horizon]
        waits = np.array([(_or(self.first_start[i], self.horizon) - self.pods[i].arrival_s) / _HOUR
                          for i in arrived] or [0.0])
        return ReplayOutcome(
            lending=self.lending, pods=len(arrived), finished=self.finished,
            still_waiting=sum(1 for i in arrived if self.first_start[i] is None),
            allocated_gpu_hours=round(self.gpu_hours[_Status.REGULAR], 3),
            borrowed_gpu_hours=round(self.gpu_hours[_Status.BORROWER], 3),
            mean_wait_hours=round(float(waits.mean()), 4), p95_wait_hours=round(float(np.percentile(waits, 95)), 4),
            lends=self.lends, reclaims=self.reclaims, lent_gpu_hours=round(self.lent_gpu_hours, 3),
            resume_wait_hours=round(self.resume_wait_hours + sum(
                self.horizon - at for at in self.reclaimed_at.values()) / _HOUR, 3),
            remote_borrow=self.asked_remote, remote_starts=self.remote_starts,
            remote_borrowers=len(self.remote_ran), remote_gpu_hours=round(self.remote_gpu_hours, 3))


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _split(placement: Placement) -> tuple[Placement, Placement]:
    """A regular pod's booking in the lent ledger: its CPU and memory, and (lendable) its GPUs."""
    host = replace(placement, pod_key=f"{placement.pod_key}#host", containers=())
    gpus = replace(placement, pod_key=f"{placement.pod_key}#gpu", cpu_milli=0, memory_mib=0)
    return host, gpus


def replay(nodes: Sequence[NodeSpec], pods: Sequence[ArrivingPod], policy: str, *, lending: bool,
           hours: float, seed: int = 42, remote_borrow: bool = False) -> ReplayOutcome:
    """Replay ``pods`` on ``nodes`` for ``hours`` with one placement policy, lending or not; with
    ``remote_borrow`` (lending only) borrowers may also use a remote share (see the module docstring)."""
    return _Replay(nodes, pods, policy, lending=lending, hours=hours, seed=seed,
                   remote_borrow=remote_borrow).run()
