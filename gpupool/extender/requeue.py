"""Ask kube-scheduler to retry a preemptor once the victims the extender named for it are gone.

Why: kube-scheduler deletes the victims of a preemption and retries the preemptor on their delete
events (``MoveAllToActiveOrBackoffQueue``). The extender learns of the same deletes from its own
watch, and when the retry's filter comes first (a millisecond race) the victims still hold their
cards in the ledger: the filter refuses, the pod goes back to the unschedulable queue, and no
further event comes. kube-scheduler v1.20 then waits for its 60 s flush of unschedulable pods.

The remedy is a nudge: once the watch has released the bookings of every victim the extender named
for a pod on one node, the pod gets a small annotation patch (:attr:`PreemptRequeue.annotation`).
In kube-scheduler v1.20 (``scheduling_queue.go``) an update of a pending pod that changes more than
its status (``isPodUpdated``) moves it from the unschedulable queue straight to the active queue,
moves it out of the backoff queue, and adds it to the active queue while a cycle of it is in flight
(that cycle's failure then finds it queued); ``skipPodUpdate`` skips only assumed pods. The patch
is written after the victim's delete, so kube-scheduler's informer has the victim gone too.

A nudge decides nothing: it books and frees no card, and the retried filter and the bind's check
under the ledger lock decide as always. So a nudge that comes too early, twice, or for a pod that
fits no more costs one scheduling cycle, never a double booking. Bounds: at most
:attr:`RequeueSettings.max_tracked` answers are watched, each for :attr:`RequeueSettings.ttl_s`
(victims never deleted, or deleted on another node, are forgotten); each answer is nudged at most
once; nudges are rate-limited and sent from a thread of their own, never from the watch or a request.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from gpupool.api.names import DEFAULT_DOMAIN
from gpupool.extender.cache import ClusterCache
from gpupool.extender.nudge import FAILED as FAILED  # re-exported
from gpupool.extender.nudge import GONE as GONE
from gpupool.extender.nudge import NUDGED as NUDGED
from gpupool.extender.nudge import Pending as Pending
from gpupool.extender.nudge import TokenBucket, nudge_pod, stamp
from gpupool.kube.podapi import PodApi

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequeueSettings:
    """Bounds of the preemptor watch and of the nudges."""

    hold_s: float = 30.0
    """How long after an answer the same pod gets no further victims while those named are still
    booked (the extender may not have seen their delete yet; a second answer would evict more pods
    for one), and how long after the victims on one node are all released: that node has room for
    the pod now, and kube-scheduler asking again means its own cache or the filter it ran just
    before had not seen the release yet (the nudge that follows has it retried). Past it, a victim
    kube-scheduler failed to delete, or room another pod took meanwhile, no longer blocks the pod."""
    ttl_s: float = 300.0
    """How long the victims of one preempt answer are waited for (kube-scheduler deletes them at
    once; a victim terminates within its grace period, 30 s by default)."""
    max_tracked: int = 1024
    """Answers watched at once; the oldest is forgotten beyond this."""
    max_due: int = 256
    """Nudges waiting for the rate limit; the oldest is dropped beyond this (its pod still gets
    kube-scheduler's own 60 s retry)."""
    rate_per_s: float = 20.0
    burst: int = 20
    conflict_retries: int = 3
    """Re-reads of a pod whose patch met a newer version (kube-scheduler writes its status)."""
    idle_wait_s: float = 5.0
    """Longest sleep of the nudging thread between expiries when nothing is due."""


@dataclass(frozen=True)
class Due:
    """A pod to nudge: every victim named for it on ``node`` is gone."""

    key: str
    uid: str
    """Empty when the watch had not delivered the pod when it was answered."""
    node: str


@dataclass
class _Answer:
    """One preemptor's latest answer: per node, the victims whose bookings still stand."""

    uid: str
    at: float
    waiting: dict[str, set[str]]


def cache_pending(cache: ClusterCache) -> Pending:
    """A :data:`Pending` over the extender's cache: a GPU pod the watch delivered, bound to no node
    and holding no booking (a bind of it in flight books its cards: no nudge then)."""
    def pending(key: str) -> str | None:
        with cache.lock:
            record = cache.pods.get(key)
            if record is None or record.node_name or record.finished or key in cache.state.placements:
                return None
            return record.uid
    return pending


class PreemptRequeue:
    """Remembers preempt answers, hears of released bookings, and nudges the pods whose victims are gone.

    :meth:`remember` and :meth:`released` are called under the cache's lock (the service's
    preempt, the watch): they only touch this object's own state under its own lock, which is never
    held while the cache's is taken. :meth:`run_once` does the API calls, on the nudging thread.
    """

    def __init__(self, api: PodApi, domain: str = DEFAULT_DOMAIN, *, pending: Pending,
                 settings: RequeueSettings | None = None, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.api = api
        self.annotation = f"{domain}/victims-released"
        """Pod annotation: the node whose victims were released and when (its change is the nudge)."""
        self.pending = pending
        self.settings = settings or RequeueSettings()
        self.clock = clock
        self.now = now
        self.stats: Counter[str] = Counter()
        """Nudges by outcome (:data:`NUDGED`, :data:`GONE`, :data:`FAILED`), and ``dropped``/``expired``."""
        self._lock = threading.Lock()
        self._answers: OrderedDict[str, _Answer] = OrderedDict()
        self._freed: OrderedDict[str, float] = OrderedDict()
        """Preemptors whose victims on one node were all released, and when."""
        self._by_victim: dict[str, set[str]] = {}
        self._due: deque[Due] = deque()
        self._bucket = TokenBucket(self.settings.rate_per_s, self.settings.burst, clock)
        self._wake = threading.Event()

    # ------------------------------------------------------------------- under the cache's lock
    def remember(self, key: str, victims: Mapping[str, Collection[str]]) -> None:
        """The preempt answer for pod ``key``: per node, the keys of the pods named to evict there.
        Replaces the pod's earlier answer. The watch may not have delivered the pod yet (kube-scheduler
        asks within milliseconds of its creation): its uid is then taken when it is nudged."""
        uid = self.pending(key) or ""
        waiting = {node: set(keys) for node, keys in victims.items() if keys}
        if not waiting:
            return
        with self._lock:
            self._drop(key)
            self._freed.pop(key, None)
            self._answers[key] = _Answer(uid, self.clock(), waiting)
            for keys in waiting.values():
                for victim in keys:
                    self._by_victim.setdefault(victim, set()).add(key)
            while len(self._answers) > self.settings.max_tracked:
                self._drop(next(iter(self._answers)))
                self.stats["dropped"] += 1
        log.info("preempt for pod %s names %s; it is retried once they are gone", key,
                 "; ".join(f"on {node}: {', '.join(sorted(keys))}" for node, keys in sorted(waiting.items())))

    def awaiting(self, key: str) -> bool:
        """Whether pod ``key`` was answered less than :attr:`RequeueSettings.hold_s` ago and no node's
        victims of that answer are all released yet, or one node's were released less than
        ``hold_s`` ago (a preempt then, kube-scheduler's retry racing the release, would evict the
        victims of another node for a pod that fits where the first were: a CI run saw both evicted)."""
        with self._lock:
            now = self.clock()
            answer = self._answers.get(key)
            if answer is not None and now - answer.at < self.settings.hold_s:
                return True
            freed = self._freed.get(key)
            return freed is not None and now - freed < self.settings.hold_s

    def released(self, key: str) -> None:
        """The booking (or the record) of pod ``key`` is gone: a preemptor whose victims on one node
        are now all gone is due for a nudge."""
        woke = False
        with self._lock:
            for preemptor in sorted(self._by_victim.pop(key, ())):
                answer = self._answers.get(preemptor)
                if answer is None:
                    continue
                for node, keys in answer.waiting.items():
                    keys.discard(key)
                    if not keys:
                        self._drop(preemptor)
                        self._freed[preemptor] = self.clock()
                        self._freed.move_to_end(preemptor)
                        while len(self._freed) > self.settings.max_tracked:
                            self._freed.popitem(last=False)
                        self._queue(Due(preemptor, answer.uid, node))
                        woke = True
                        break
        if woke:
            self.wake()

    def wake(self) -> None:
        """Have the nudging thread look now (a release, or a stop to notice)."""
        self._wake.set()

    def _drop(self, key: str) -> None:
        answer = self._answers.pop(key, None)
        if answer is None:
            return
        for keys in answer.waiting.values():
            for victim in keys:
                owners = self._by_victim.get(victim)
                if owners is not None:
                    owners.discard(key)
                    if not owners:
                        del self._by_victim[victim]

    def _queue(self, due: Due) -> None:
        self._due.append(due)
        while len(self._due) > self.settings.max_due:
            dropped = self._due.popleft()
            self.stats["dropped"] += 1
            log.warning("too many preemptors to nudge; %s waits for kube-scheduler's own retry", dropped.key)

    # --------------------------------------------------------------------------- nudging thread
    def tracked(self) -> int:
        """Answers watched now."""
        with self._lock:
            return len(self._answers)

    def expire(self) -> int:
        """Forget answers past their time and those whose pod no longer waits; returns how many."""
        oldest = self.clock() - self.settings.ttl_s
        with self._lock:
            answers = [(key, a.uid, a.at) for key, a in self._answers.items()]
        gone = [key for key, uid, at in answers if at <= oldest or (uid and self.pending(key) != uid)]
        with self._lock:
            for key in gone:
                self._drop(key)
            held_since = self.clock() - self.settings.hold_s
            while self._freed and next(iter(self._freed.values())) <= held_since:
                self._freed.popitem(last=False)
        self.stats["expired"] += len(gone)
        return len(gone)

    def run_once(self) -> int:
        """Expire, then nudge the due pods the rate limit allows; returns how many were nudged."""
        self.expire()
        nudged = 0
        while True:
            with self._lock:
                if not self._due or not self._bucket.take():
                    return nudged
                due = self._due.popleft()
            outcome = self.nudge(due)
            self.stats[outcome] += 1
            nudged += outcome == NUDGED

    def nudge(self, due: Due) -> str:
        """Patch the annotation of a pod that still waits (same uid, no node, not being deleted)."""
        uid = self.pending(due.key)  # the victims' delete came after the pod's creation: the watch has it
        if uid is None or due.uid not in ("", uid):
            log.debug("pod %s no longer waits: no retry asked", due.key)
            return GONE
        outcome = nudge_pod(self.api, due.key, uid, self.annotation, f"{due.node} {stamp(self.now())}",
                            conflict_retries=self.settings.conflict_retries)
        if outcome == NUDGED:
            log.info("pod %s: its victims on node %s are released; asked kube-scheduler to retry it",
                     due.key, due.node)
        return outcome

    def run(self, stop: threading.Event) -> None:
        """Nudge as releases come in, until ``stop`` is set; a failing round is logged and the loop goes on."""
        while not stop.is_set():
            with self._lock:
                waiting = bool(self._due)
                sleep = self._bucket.wait_s() if waiting else self.settings.idle_wait_s
            self._wake.wait(max(sleep, 0.001))
            self._wake.clear()
            try:
                self.run_once()
            except Exception:  # the loop must outlive a bug in one round
                log.exception("preemptor requeue round failed")

    def start(self, stop: threading.Event) -> threading.Thread:
        """Run on a daemon thread."""
        thread = threading.Thread(target=self.run, args=(stop,), name="gpupool-requeue", daemon=True)
        thread.start()
        return thread

