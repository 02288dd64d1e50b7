"""An apiserver that stalls chosen calls and a watch that runs behind it, for the bind race tests.

Why: the binds of one pod race only when the apiserver is slow (a stalled write, a read retried
until its timeout) and the extender's watch has not yet shown what the first bind wrote. Both
are made explicit here: :class:`StallingApi` holds a chosen call until the test lets it go (or
for a fixed time), :class:`LaggingWatch` hands each change of the fake API to the cache
``lag_s`` late, in order.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import BindResult
from gpupool.testing.fake_api import FakePodApi

SAFETY_S = 10.0
"""The longest a held call waits for a test that forgot to release it (a test never hangs)."""


class Hold:
    """One stalled call: ``entered`` is set once the call has arrived; it goes on at :meth:`release`
    or after ``seconds`` (when given)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.entered = threading.Event()
        self._go = threading.Event()

    def release(self) -> None:
        self._go.set()

    def stall(self) -> None:
        self.entered.set()
        self._go.wait(SAFETY_S if self.seconds is None else self.seconds)


class StallingApi:
    """A :class:`FakePodApi` whose next call of a given verb for a given pod stalls (a ``PodApi``).

    Verbs: ``get``, ``patch``, ``bind``. A stall happens before the call reaches the fake API, so a
    stalled write is applied only once it goes on (as when the request itself hangs).
    """

    def __init__(self, api: FakePodApi) -> None:
        self.api = api
        self._holds: dict[tuple[str, str], list[Hold]] = {}
        self._lock = threading.Lock()
        self.bound: list[str] = []
        """Names of the pods whose Binding the API accepted, in order (a refused one is not here)."""

    def hold(self, verb: str, name: str, seconds: float | None = None) -> Hold:
        """Stall the next ``verb`` call for pod ``name`` (queued after earlier holds of the same call)."""
        hold = Hold(seconds)
        with self._lock:
            self._holds.setdefault((verb, name), []).append(hold)
        return hold

    def _stall(self, verb: str, name: str) -> None:
        with self._lock:
            waiting = self._holds.get((verb, name))
            hold = waiting.pop(0) if waiting else None
        if hold is not None:
            hold.stall()

    def get_pod(self, namespace: str, name: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        self._stall("get", name)
        return self.api.get_pod(namespace, name)

    def patch_pod_annotations(self, namespace: str, name: str, resource_version: str,
                              annotations: dict[str, str | None]) -> dict[str, Any]:
        self._stall("patch", name)
        return self.api.patch_pod_annotations(namespace, name, resource_version, annotations)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, **binding: Any) -> None:
        self._stall("bind", name)
        self.api.bind_pod(namespace, name, uid, node, **binding)
        with self._lock:
            self.bound.append(name)


class LaggingWatch:
    """Hands every change of a :class:`FakePodApi` to a cache ``lag_s`` after it happened, in order."""

    def __init__(self, api: FakePodApi, cache: ClusterCache, lag_s: float) -> None:
        self.cache = cache
        self.lag_s = lag_s
        self._events: queue.Queue[tuple[float, str, dict[str, Any]] | None] = queue.Queue()
        self._flushing = threading.Event()
        api.listeners.append(self._arrive)
        self._thread = threading.Thread(target=self._deliver, name="lagging-watch", daemon=True)
        self._thread.start()

    def _arrive(self, kind: str, pod: dict[str, Any]) -> None:
        self._events.put((time.monotonic() + self.lag_s, kind, pod))

    def _deliver(self) -> None:
        while (item := self._events.get()) is not None:
            due, kind, pod = item
            wait = due - time.monotonic()
            if wait > 0:
                self._flushing.wait(wait)
            if kind == "DELETED":
                self.cache.remove_pod(pod)
            else:
                self.cache.upsert_pod(pod)
            self._events.task_done()
        self._events.task_done()

    def flush(self) -> None:
        """Deliver every change made so far now, and return once the cache has applied them."""
        self._flushing.set()
        self._events.join()
        self._flushing.clear()

    def close(self) -> None:
        self._flushing.set()
        self._events.put(None)
        self._thread.join(SAFETY_S)


class BindInThread:
    """One bind running on its own thread (as kube-scheduler's binds reach the bind pool)."""

    def __init__(self, binder: Binder, pod: dict[str, Any], node: str) -> None:
        meta = pod["metadata"]
        self.result: BindResult | None = None
        self._thread = threading.Thread(
            target=self._run, args=(binder, meta["namespace"], meta["name"], meta["uid"], node), daemon=True
        )
        self._thread.start()

    def _run(self, binder: Binder, namespace: str, name: str, uid: str, node: str) -> None:
        self.result = binder.bind(namespace, name, uid, node)

    def join(self) -> BindResult:
        self._thread.join(SAFETY_S)
        assert self.result is not None, "the bind did not finish"
        return self.result
