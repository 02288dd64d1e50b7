"""This node's pods, kept current by a list+watch selected by ``spec.nodeName``.

Why a cache: the agent needs the pods kubelet lists on every Allocate and on every PodResources poll
(0.5 s). Reading each of them from the API would cost one GET per pod per call, on every node; a
watch costs one open request while nothing changes, and one event per change.

How it is fed: :class:`gpupool.kube.listwatch.ListWatch` runs on a daemon thread (the official
client blocks), lists from the apiserver's watch cache (``resourceVersion=0``: thousands of agents
re-listing after a roll-out must not each make etcd scan every pod, which it would for a field
selector), watches on from the list's version, re-lists after ``410 Gone`` and backs off (doubling,
capped, jittered) on errors. Each pod is decoded on that thread and handed to the event loop in
order (``call_soon_threadsafe``); the store is read and written only on the loop.

One decode per event: each pod is read once, on the watch thread, into a
:class:`~gpupool.nodeagent.node_pod.NodePod` (:func:`~gpupool.nodeagent.node_pod.decode_node_pod`).
The store keeps its view; the feeds (:attr:`NodePodCache.feeds`: the lending side's pods, the
container directory) receive that same record, never the raw object, so none decodes it again.

How :meth:`NodePodCache.get` answers (the :class:`PodSource` contract):

* from the store at once when the watch has delivered the pod (the normal case);
* a pod the store lacks is usually one kubelet learnt of a few milliseconds before this watch did
  (both watch the same binding). The call waits for it, woken by the event that brings it, at most
  :data:`ARRIVAL_WAIT_S`; then, as the last resort (the watch is broken or far behind), one GET,
  counted in :attr:`PodCacheStats.fallback_reads` and logged. The pod it returns is decoded into the
  same :class:`~gpupool.nodeagent.node_pod.NodePod` an event would be and handed to the store and
  the feeds as an ``ADDED`` event, unless the watch holds the pod or spoke of it while the read was
  in flight (:mod:`gpupool.nodeagent.pod_read_gate`: the watch stays authoritative, so a late read
  never brings back a pod it deleted nor replaces a newer version). Without that hand-off the
  lending side would grant from a pod it never saw (the checkpoint directory keyed by
  ``namespace/name`` instead of the controller, a borrower taken for an owner);
* a pod the watch saw deleted, or that such a GET found missing, in the last
  :data:`ABSENT_TTL_S` is answered ``None`` after the wait, without a GET: kubelet lists a deleted
  pod for a moment after the API removed it, and the poller would otherwise read it every 0.5 s.
  The wait still comes first, so a pod re-created under the same name (a StatefulSet's) is found.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpupool.api.names import ResourceNames
from gpupool.kube.listwatch import Backoff, ListFn, ListWatch
from gpupool.nodeagent.node_pod import NodePod, PodEntry, PodKey, UnreadablePod, decode_node_pod
from gpupool.nodeagent.pod_read_gate import PodReadGate
from gpupool.nodeagent.types import PodView

log = logging.getLogger(__name__)

ReadPod = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]
"""The last-resort read of one pod by name (an API GET): the pod object as JSON, decoded by the cache
as a watch event is; ``None`` when it does not exist."""

#: How long :meth:`NodePodCache.get` waits for the watch to bring a pod kubelet already lists
#: before reading it from the API. The watch trails kubelet's own by milliseconds.
ARRIVAL_WAIT_S = 1.0
#: How long a pod the watch saw deleted (or a read found missing) counts as known to be gone.
ABSENT_TTL_S = 30.0
#: Back-off of the list+watch after an error: 0.5 s doubling to 30 s, each up to half shorter at
#: random, so the agents of every node do not retry in step after an apiserver outage.
BACKOFF_INITIAL_S, BACKOFF_MAX_S, BACKOFF_JITTER = 0.5, 30.0, 0.5
#: Each watch request asks the server to end it after a random 5 to 10 minutes (as client-go
#: does), so the agents' re-watches spread out instead of arriving together.
WATCH_TIMEOUT_RANGE_S = (300, 600)


DecodePod = Callable[[Mapping[str, Any], ResourceNames], NodePod | None]
"""Reads one pod object into its record (:func:`decode_node_pod`; a test may count the calls)."""


class PodFeed(Protocol):
    """Also receives the pods the watch delivers, decoded, on the watch's thread (the lending side's
    pods; the usage monitor's container directory, which needs the runtime container IDs the pod
    view drops)."""

    def on_list(self, pods: Iterable[NodePod]) -> None:
        """A full list of this node's pods."""
        ...

    def on_event(self, kind: str, pod: NodePod) -> None:
        """One watch event (``ADDED``, ``MODIFIED``, ``DELETED``)."""
        ...


@dataclass
class PodCacheStats:
    """How :meth:`NodePodCache.get` was answered, and what the watch delivered (tests, metrics)."""

    lists: int = 0
    events: int = 0
    hits: int = 0
    """Answered from the store at once."""
    waited: int = 0
    """Answered from the store after waiting for the watch to bring the pod."""
    absent: int = 0
    """Answered ``None`` from a recent delete or 404, without an API read."""
    fallback_reads: int = 0
    """API GETs: the pod had not arrived within :data:`ARRIVAL_WAIT_S` (the last resort)."""
    reads_handed_on: int = 0
    """Of those, the pods handed to the store and the feeds (the watch had said nothing of them)."""


class NodePodCache:
    """:meth:`PodSource.get` over a watch of one node's pods; :meth:`run` keeps it current."""

    def __init__(self, node: str, names: ResourceNames, list_pods: ListFn, read: ReadPod, *,
                 arrival_wait_s: float = ARRIVAL_WAIT_S, absent_ttl_s: float = ABSENT_TTL_S,
                 backoff: Backoff | None = None, watch_timeout_s: int | None = None,
                 clock: Callable[[], float] = time.monotonic, decode: DecodePod = decode_node_pod) -> None:
        self.node = node
        self.names = names
        self.stats = PodCacheStats()
        self._list_pods = functools.partial(list_pods, field_selector=f"spec.nodeName={node}")
        self._read = read
        self._arrival_wait_s = arrival_wait_s
        self._absent_ttl_s = absent_ttl_s
        self._backoff = backoff or Backoff(BACKOFF_INITIAL_S, BACKOFF_MAX_S, BACKOFF_JITTER)
        self._watch_timeout_s = watch_timeout_s or random.randrange(*WATCH_TIMEOUT_RANGE_S)
        self._clock = clock
        self._decode = decode
        self._entries: dict[PodKey, PodEntry] = {}
        self._absent_since: dict[PodKey, float] = {}
        self._arrivals: dict[PodKey, list[asyncio.Future[None]]] = {}
        self._synced = asyncio.Event()
        self._gate = PodReadGate()
        self.watch: ListWatch | None = None
        self.feeds: list[PodFeed] = []
        """Told of every list and event as it arrives (on the watch thread), with the record the
        cache decoded; a failing feed is logged and never stops the watch."""

    # ------------------------------------------------------------------ reading (PodSource)
    @property
    def synced(self) -> bool:
        """Whether a first list has been applied."""
        return self._synced.is_set()

    async def wait_synced(self, timeout_s: float) -> bool:
        """Until the first list is applied (or ``timeout_s``); returns :attr:`synced`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._synced.wait()
        return self.synced

    def cached(self, namespace: str, name: str) -> PodView | None:
        """The pod as the watch last said, without waiting or reading (tests, diagnostics)."""
        entry = self._entries.get((namespace, name))
        return entry if isinstance(entry, PodView) else None

    async def get(self, namespace: str, name: str) -> PodView | None:
        """The pod from the store; waits briefly for one not there yet, then reads it (module doc).

        Raises ``ValueError`` for a pod that cannot be decoded, as a read of it would.
        """
        key = (namespace, name)
        entry = self._entries.get(key)
        if entry is not None:
            self.stats.hits += 1
        else:
            entry = await self._arrival(key)
            if entry is not None:
                self.stats.waited += 1
            elif self._known_absent(key):
                self.stats.absent += 1
                return None
            else:
                return await self._read_through(key)
        if isinstance(entry, UnreadablePod):
            raise ValueError(entry.error)
        return entry

    async def _arrival(self, key: PodKey) -> PodEntry | None:
        """Wait up to the arrival bound for the watch to bring ``key``."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._arrivals.setdefault(key, [])
        waiters.append(future)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._arrival_wait_s):
                    await future
        finally:
            waiters.remove(future)
            if not waiters:
                del self._arrivals[key]
        return self._entries.get(key)

    async def _read_through(self, key: PodKey) -> PodView | None:
        """One GET; what it finds goes to the store and the feeds as a watch event would, unless the
        watch had its own word on the pod (:mod:`gpupool.nodeagent.pod_read_gate`)."""
        self.stats.fallback_reads += 1
        log.info("pod %s/%s not in the watch cache after %.1f s (watch synced: %s); reading it from "
                 "the API", key[0], key[1], self._arrival_wait_s, self.synced)
        with self._gate.lock:
            ticket = self._gate.begin(key)
        try:
            obj = await self._read(*key)
            pod = self._decode(obj, self.names) if obj is not None else None
        except BaseException:
            with self._gate.lock:
                self._gate.end(ticket)
            raise
        with self._gate.lock:  # checked and handed on in one step: a watch event comes before or after
            may_hand_on = self._gate.end(ticket)
            if may_hand_on and obj is not None and pod is not None and pod.key == key and self._ours(obj):
                self._hand_on(pod)
        if pod is None or pod.key != key:
            self._absent_since[key] = self._clock()
            return None
        if isinstance(pod.view, UnreadablePod):
            raise ValueError(pod.view.error)
        return pod.view

    def _hand_on(self, pod: NodePod) -> None:
        """The read's pod to the feeds and the store, as an ``ADDED`` event (with the gate's lock held)."""
        self._gate.handed_on(pod.key)
        self._feed("read", lambda feed: feed.on_event("ADDED", pod))
        self._put(pod.key, pod.view)
        self.stats.reads_handed_on += 1
        log.info("pod %s/%s, read from the API, handed to the store and the pod feeds", *pod.key)

    def _known_absent(self, key: PodKey) -> bool:
        since = self._absent_since.get(key)
        return since is not None and self._clock() - since < self._absent_ttl_s

    # ------------------------------------------------------------------ applying (event loop)
    def replace(self, entries: dict[PodKey, PodEntry]) -> None:
        """A list: the store becomes exactly ``entries``; pods no longer listed count as deleted."""
        self.stats.lists += 1
        for key in self._entries.keys() - entries.keys():
            self._absent_since[key] = self._clock()
        self._entries = dict(entries)
        for key in entries:
            self._arrived(key)
        self._synced.set()

    def upsert(self, key: PodKey, entry: PodEntry) -> None:
        self.stats.events += 1
        self._put(key, entry)

    def _put(self, key: PodKey, entry: PodEntry) -> None:
        self._entries[key] = entry
        self._arrived(key)

    def remove(self, key: PodKey) -> None:
        self.stats.events += 1
        self._entries.pop(key, None)
        now = self._clock()
        self._absent_since = {k: t for k, t in self._absent_since.items() if now - t < self._absent_ttl_s}
        self._absent_since[key] = now

    def _arrived(self, key: PodKey) -> None:
        self._absent_since.pop(key, None)
        for future in self._arrivals.get(key, ()):
            if not future.done():
                future.set_result(None)

    # ------------------------------------------------------------------ the watch (its thread)
    async def run(self) -> None:
        """List and watch until cancelled. The watch thread then stops at its next event or when
        the server ends the request; it is a daemon thread, so it never holds up an exit."""
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        def post(apply: Callable[..., None], *args: Any) -> None:
            if not stop.is_set():
                try:
                    loop.call_soon_threadsafe(apply, *args)
                except RuntimeError:  # the loop has closed under the thread
                    stop.set()

        def on_list(items: Iterable[dict[str, Any]]) -> None:
            decoded = [self._decode(obj, self.names) for obj in items if self._ours(obj)]
            pods = [pod for pod in decoded if pod is not None]
            with self._gate.lock:  # recorded, fed and posted as one step beside a read's hand-off
                self._gate.listed(pod.key for pod in pods)
                self._feed("list", lambda feed: feed.on_list(pods))
                post(self.replace, {pod.key: pod.view for pod in pods})

        def on_event(kind: str, obj: dict[str, Any]) -> None:
            pod = self._decode(obj, self.names)
            if pod is None:
                return
            gone = kind == "DELETED" or not self._ours(obj)
            with self._gate.lock:
                self._gate.said(pod.key, gone)
                self._feed(kind, lambda feed: feed.on_event("DELETED" if gone else kind, pod))
                if gone:
                    post(self.remove, pod.key)
                else:
                    post(self.upsert, pod.key, pod.view)

        self.watch = ListWatch(f"pods on {self.node}", self._list_pods, on_list, on_event, stop=stop,
                               watch_timeout_s=self._watch_timeout_s, backoff=self._backoff,
                               list_resource_version="0")
        self.watch.start()
        try:
            await asyncio.Future()  # until cancelled
        finally:
            stop.set()

    def _feed(self, what: str, call: Callable[[PodFeed], None]) -> None:
        for feed in self.feeds:
            try:
                call(feed)
            except Exception:
                log.exception("pod feed %s failed on a %s", type(feed).__name__, what)

    def _ours(self, obj: Mapping[str, Any]) -> bool:
        """The selector already says so; checked again so a pod of another node can never be used."""
        return bool((obj.get("spec") or {}).get("nodeName") == self.node)
