"""Wake the pods the extender refused when a change may now let them fit.

Why: a pod the extender's filter refuses everywhere has no rejecting plugin of kube-scheduler's own,
so kube-scheduler parks it until some cluster event it watches, or its five-minute flush. Many of
the changes that let such a pod fit are invisible to kube-scheduler: a GpuQuota raised or deleted, a
ResourceGroup widened, a loan offered, a card healthy again, a node agent's Lease renewed again. The
issue 28 probe measured 88 s after a quota was deleted and pods still pending 101 s after one was
raised. So the extender watches for such changes itself and nudges (:mod:`gpupool.extender.nudge`)
the refused pods that would pass now.

How, and its bounds:

* The filter reports each pod it passed no node for (:meth:`PendingWakeUp.refused`, under the
  cache lock); at most :attr:`WakeSettings.max_tracked` are remembered, each for
  :attr:`WakeSettings.ttl_s` or until it is bound, booked, deleted or refused again.
* Every :attr:`WakeSettings.poll_s` the loop reads a signature of what can only loosen a refusal
  (:func:`loosening_signature`: the tenancy objects' version, card health and sizes, loans, the
  nodes refused for their agent's Lease or a broken description), together with the remembered
  pods, under the cache lock. Reading both at once closes a race: a refusal filed after that read
  was decided on a ledger at least as new, so it needs no re-check for this change.
* When the signature moved, the remembered pods are checked again (the filter's own checks over
  every node, :meth:`ExtenderService.fits_somewhere`), at most :attr:`WakeSettings.checks_per_round`
  a round; those that would pass somewhere are nudged, at most :attr:`WakeSettings.rate_per_s`, and
  forgotten (a pod refused again is filed again). Pods still refused wait for the next change.

A replica that becomes leader has filed nothing: the refusals were its predecessor's. Once its
ledger caught up (:class:`gpupool.extender.handover.Handover`), it adopts every GPU pod still
waiting (:meth:`PendingWakeUp.adopt`); those are checked in the next round rather than at the next
change, since the old leader may have died between a change and its nudge.

Only pods the extender itself refused (or, after a fail-over, its predecessor may have refused)
are ever nudged, and only when its own check says they would now pass some node: a quota raised in
one namespace wakes that namespace's pods, not every pending pod. A nudge decides nothing (the
retried filter and the bind do), so a wrong guess costs one scheduling cycle.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpupool.api.names import DEFAULT_DOMAIN
from gpupool.api.tenancy import TenancyNames
from gpupool.core.model import PodRequest
from gpupool.extender.booking_keeper import ASSUMED_RESERVED, ASSUMED_SEEN
from gpupool.extender.cache import ClusterCache
from gpupool.extender.nudge import NUDGED, Pending, TokenBucket, nudge_pod, stamp
from gpupool.extender.preemption import NodeGate
from gpupool.kube.podapi import PodApi
from gpupool.kube.tenancy import PodTenancy, pod_tenancy
from gpupool.kube.translate import foreign_resources

log = logging.getLogger(__name__)

UNCHECKED = "unchecked"
"""The signature an adopted pod was "checked" at: equal to no real one, so the next round checks it."""

BOUND_ENDS = frozenset({ASSUMED_RESERVED, ASSUMED_SEEN})
"""Ends of an assumption that hand its space to its own pod's bind: nothing was freed."""


class Describe(Protocol):
    """What the filter would be given for a pod object: its request, foreign aliases and tenancy;
    raises ``ValueError`` (``TranslationError``) for a pod gpupool refuses."""

    def __call__(self, pod: Mapping[str, Any]) -> tuple[PodRequest, frozenset[str], PodTenancy | None]:
        """The filter's arguments for ``pod``."""


def filter_arguments(cache: ClusterCache) -> Describe:
    """A :class:`Describe` translating as the filter's HTTP handler does (the watch's request memo,
    the pod's tenancy, its foreign aliases)."""
    tenancy_names = TenancyNames(cache.names.domain)

    def describe(pod: Mapping[str, Any]) -> tuple[PodRequest, frozenset[str], PodTenancy | None]:
        return cache.requests.request(pod), foreign_resources(pod), pod_tenancy(pod, tenancy_names)
    return describe


class Fits(Protocol):
    """The filter's verdict over every node (:meth:`ExtenderService.fits_somewhere`)."""

    def __call__(self, request: PodRequest, aliases: frozenset[str] = ..., tenant: PodTenancy | None = ...,
                 pod: Mapping[str, Any] | None = ...) -> bool:
        """Whether the pod would pass some node now."""


@dataclass(frozen=True)
class WakeSettings:
    """Bounds of the wake-up."""

    poll_s: float = 0.5
    """How often the signature is read (a cheap read under the cache lock)."""
    ttl_s: float = 900.0
    """How long a refused pod is remembered (kube-scheduler's own flush retries it meanwhile)."""
    max_tracked: int = 1024
    """Refused pods remembered at once; the oldest is forgotten beyond this."""
    checks_per_round: int = 128
    """Remembered pods checked again per round after a change (each check is one filter over every
    node, under the cache lock); the rest are checked in the next rounds."""
    rate_per_s: float = 20.0
    burst: int = 40


@dataclass
class _Refused:
    """One refused pod, with what its filter was given, and the signature it was last checked at."""

    request: PodRequest
    aliases: frozenset[str]
    tenant: PodTenancy | None
    pod: Mapping[str, Any] | None
    uid: str
    at: float
    checked: Hashable | None


def loosening_signature(cache: ClusterCache, node_gate: NodeGate) -> Hashable:
    """What may let a refused pod fit when it changes (call with the cache lock held).

    Not the bookings of pods bound (each would re-check every refused pod) nor the node layout
    (kube-scheduler sees Node updates), but the count of pods that ended: kube-scheduler retries a
    refused pod on the deletion event, often before this extender's watch has given the cards and
    the quota back, and then parks it again on a stale refusal (an e2e run waited past 90 s for a
    pod a deleted one had held back by its quota). The filter's assumptions are the extender's own
    bookings, so those that ended without their pod's bind (expired, refused, replaced...) count:
    kube-scheduler never saw the space they held being taken. DRA claims released count too (a
    claim's end is no event kube-scheduler retries an extender's refusal on)."""
    state = cache.state
    present = state.present[:state.size]
    healthy = state.card_healthy[:state.size][present]
    ends = cache.assumption_ends
    unbound = sum(count for how, count in ends.items() if how not in BOUND_ENDS)
    return (cache.tenancy.version, unbound, sum(cache.released_bookings.values()), cache.claims.released,
            int(np.count_nonzero(healthy)), int(state.card_mem_total[:state.size][present].sum()),
            state.lent.totals(),
            frozenset(cache.node_problems), frozenset(cache.claim_problems), frozenset(node_gate(state)),
            frozenset(cache.share_refusals))


class PendingWakeUp:
    """Remembers refused pods and nudges those a change lets fit (see the module docstring).

    :meth:`refused` runs under the cache's lock (the filter) and only touches this object's own
    state under its own lock, which is never held while the cache's is taken.
    """

    def __init__(self, api: PodApi, cache: ClusterCache, fits: Fits, *, pending: Pending,
                 node_gate: NodeGate = lambda _: {}, domain: str = DEFAULT_DOMAIN,
                 settings: WakeSettings | None = None, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.api = api
        self.cache = cache
        self.fits = fits
        self.pending = pending
        self.node_gate = node_gate
        self.annotation = f"{domain}/retry-after-change"
        """Pod annotation: why and when the pod was woken (its change is the nudge)."""
        self.settings = settings or WakeSettings()
        self.clock = clock
        self.now = now
        self.stats: Counter[str] = Counter()
        """Nudges by outcome, and ``checked``/``still_refused``/``expired``/``dropped``."""
        self._lock = threading.Lock()
        self._refused: OrderedDict[str, _Refused] = OrderedDict()
        self._due: deque[tuple[str, str]] = deque()
        self._bucket = TokenBucket(self.settings.rate_per_s, self.settings.burst, clock)
        self._signature: Hashable | None = None

    # ------------------------------------------------------------------- under the cache's lock
    def refused(self, request: PodRequest, aliases: frozenset[str], tenant: PodTenancy | None,
                pod: Mapping[str, Any] | None) -> None:
        """The filter passed no node for pod ``request.key``: remember it (replacing an older entry)."""
        uid = str(((pod or {}).get("metadata") or {}).get("uid") or "")
        with self._lock:
            self._refused.pop(request.key, None)
            # checked at the current signature: this refusal was decided on the ledger as it is now
            self._refused[request.key] = _Refused(request, aliases, tenant, pod, uid, self.clock(), self._signature)
            while len(self._refused) > self.settings.max_tracked:
                self._refused.popitem(last=False)
                self.stats["dropped"] += 1

    def adopt(self, pods: Iterable[Mapping[str, Any]], describe: Describe) -> int:
        """File the waiting GPU pods among ``pods`` (a new leader's list), to be checked in the next
        round; returns how many. Pods already filed, not waiting in the ledger's view (bound,
        booked, unknown to the watch) or refused by gpupool's translation are skipped."""
        adopted = 0
        for pod in pods:
            meta = pod.get("metadata") or {}
            key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            uid = str(meta.get("uid") or "")
            if self.pending(key) != uid or not uid:
                continue
            try:
                request, aliases, tenant = describe(pod)
            except ValueError as exc:
                log.debug("not adopting pod %s for wake-up: %s", key, exc)
                continue
            with self._lock:
                if key in self._refused:
                    continue
                self._refused[key] = _Refused(request, aliases, tenant, pod, uid, self.clock(), UNCHECKED)
                adopted += 1
                while len(self._refused) > self.settings.max_tracked:
                    self._refused.popitem(last=False)
                    self.stats["dropped"] += 1
        self.stats["adopted"] += adopted
        if adopted:
            log.info("took over %d waiting GPU pods from the previous leader: each is checked and nudged if it "
                     "fits now", adopted)
        return adopted

    def tracked(self) -> int:
        with self._lock:
            return len(self._refused)

    # --------------------------------------------------------------------------- the loop's thread
    def run_once(self) -> int:
        """Read the signature, check the pods not yet checked at it, nudge the due ones; returns
        how many were nudged."""
        with self.cache.lock:
            signature = loosening_signature(self.cache, self.node_gate)
            with self._lock:
                changed = self._signature is not None and signature != self._signature
                self._signature = signature
                stale = [(key, entry) for key, entry in self._refused.items() if entry.checked != signature]
        if changed:
            log.debug("a quota, group, loan, card or node changed: %d refused pods to check", len(stale))
        self._expire()
        checks = 0
        for key, entry in stale:
            if entry.checked is None:  # filed before the first signature: nothing to compare with
                entry.checked = signature
                continue
            if checks >= self.settings.checks_per_round:
                break
            checks += 1
            self._check(key, entry, signature)
        return self._nudge_due()

    def _check(self, key: str, entry: _Refused, signature: Hashable) -> None:
        self.stats["checked"] += 1
        fits = self.fits(entry.request, entry.aliases, entry.tenant, entry.pod)
        with self._lock:
            if self._refused.get(key) is not entry:  # refused again meanwhile: the newer entry counts
                return
            if not fits:
                entry.checked = signature
                self.stats["still_refused"] += 1
                return
            del self._refused[key]
            self._due.append((key, entry.uid))

    def _expire(self) -> None:
        oldest = self.clock() - self.settings.ttl_s
        with self._lock:
            entries = list(self._refused.items())
        gone = [key for key, e in entries if e.at <= oldest or (e.uid and self.pending(key) not in (None, e.uid))]
        # a pod the watch has not delivered yet (pending None, uid known) stays; a bound or booked
        # one is dropped once the watch shows it (pending None, and the record exists)
        gone += [key for key, e in entries if key not in gone and self._settled(key)]
        with self._lock:
            for key in gone:
                if self._refused.pop(key, None) is not None:
                    self.stats["expired"] += 1

    def _settled(self, key: str) -> bool:
        """The watch knows pod ``key`` and it no longer waits (bound, booked or finished)."""
        with self.cache.lock:
            return key in self.cache.pods and self.pending(key) is None

    def _nudge_due(self) -> int:
        nudged = 0
        while True:
            with self._lock:
                if not self._due or not self._bucket.take():
                    return nudged
                key, uid = self._due.popleft()
            known = self.pending(key)
            if known is None or (uid and known != uid):
                continue
            outcome = nudge_pod(self.api, key, known, self.annotation, f"may fit now {stamp(self.now())}")
            self.stats[outcome] += 1
            if outcome == NUDGED:
                nudged += 1
                log.info("pod %s: a quota, group, loan, card or node changed and it may fit now; "
                         "asked kube-scheduler to retry it", key)

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set; a failing round is logged and the loop goes on."""
        while not stop.wait(self.settings.poll_s):
            try:
                self.run_once()
            except Exception:  # the loop must outlive a bug in one round
                log.exception("wake-up round failed")

    def start(self, stop: threading.Event) -> threading.Thread:
        """Run on a daemon thread."""
        thread = threading.Thread(target=self.run, args=(stop,), name="gpupool-wakeup", daemon=True)
        thread.start()
        return thread
