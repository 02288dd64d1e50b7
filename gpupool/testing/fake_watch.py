"""``list_pod_for_all_namespaces`` of the official client, served from a :class:`FakePodApi`.

Why: the watch loop (:mod:`gpupool.extender.watch`) has rules that only matter when the stream
misbehaves: resume after a server timeout, list again after ``410 Gone``. This stand-in speaks the
client's calling convention with ``_preload_content=False`` (a list answer with ``.data``, a watch
answer whose ``.stream()`` yields newline-separated JSON events) so those rules are tested in
process. Like the apiserver, a watch from a compacted resourceVersion answers HTTP 200 with one
``ERROR`` event of code 410; :meth:`FakeListWatch.fail_next_watch` gives an HTTP error instead.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from gpupool.testing.fake_api import FakePodApi, HistoryCompacted


class _ListAnswer:
    """A raw list answer (what ``_preload_content=False`` returns): the body is in ``data``."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.status = 200
        self.data = json.dumps(doc).encode()


class _WatchAnswer:
    """A raw watch answer: ``stream()`` yields chunks of newline-separated events; ``close()`` ends it."""

    def __init__(self, chunks: Iterator[bytes], on_close: Callable[[], None]) -> None:
        self.status = 200
        self._chunks = chunks
        self._on_close = on_close
        self.closed = False

    def stream(self, amt: int | None = None, decode_content: bool | None = None) -> Iterator[bytes]:
        yield from self._chunks

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._on_close()

    def release_conn(self) -> None:
        pass


class FakeListWatch:
    """Pods of a :class:`FakePodApi` as the list and watch calls of ``CoreV1Api``."""

    def __init__(self, api: FakePodApi, poll_s: float = 0.05) -> None:
        self.api = api
        self.poll_s = poll_s
        self.lists = 0
        self.watches = 0
        self._lock = threading.Condition()
        self._open_streams = 0
        self._generation = 0
        self._gate = threading.Event()
        self._gate.set()
        self._fail_with: int | None = None

    # ------------------------------------------------------------------------------ test side
    def hold_watches(self) -> None:
        """End every open watch stream and keep new watch calls waiting until :meth:`release_watches`.

        Returns once no stream is open, so changes made next reach the watcher only through
        what its next watch (or list) says.
        """
        with self._lock:
            self._gate.clear()
            self._generation += 1
        self.api.wake()
        with self._lock:
            self._lock.wait_for(lambda: self._open_streams == 0, timeout=10)

    def release_watches(self) -> None:
        self._gate.set()

    def fail_next_watch(self, status: int) -> None:
        """The next watch call raises ``ApiException(status)``, as an HTTP error answer does."""
        self._fail_with = status

    # -------------------------------------------------------------------------- client side
    def list_pod_for_all_namespaces(self, *, watch: bool = False, resource_version: str | None = None,
                                    timeout_seconds: int | None = None, limit: int | None = None,
                                    _continue: str | None = None, **_: Any) -> _ListAnswer | _WatchAnswer:
        if watch:
            return self._watch(int(resource_version or 0), float(timeout_seconds or 300))
        return self._list(limit, _continue)

    def _list(self, limit: int | None, token: str | None) -> _ListAnswer:
        self.lists += 1
        version = self.api.resource_version
        pods = sorted(self.api.list_pods(), key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
        start = int(token or 0)
        end = len(pods) if not limit else min(len(pods), start + limit)
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        if end < len(pods):
            meta["continue"] = str(end)
        return _ListAnswer({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": pods[start:end]})

    def _watch(self, since: int, timeout_s: float) -> _WatchAnswer:
        self._gate.wait()
        self.watches += 1
        if self._fail_with is not None:
            from kubernetes.client.exceptions import ApiException

            status, self._fail_with = self._fail_with, None
            raise ApiException(status=status, reason="injected by FakeListWatch")
        with self._lock:
            self._open_streams += 1
            generation = self._generation
        return _WatchAnswer(self._events(since, timeout_s, generation), self._closed)

    def _closed(self) -> None:
        with self._lock:
            self._open_streams -= 1
            self._lock.notify_all()

    def _events(self, since: int, timeout_s: float, generation: int) -> Iterator[bytes]:
        deadline = time.monotonic() + timeout_s
        while generation == self._generation and time.monotonic() < deadline:
            try:
                events = self.api.events_after(since, self.poll_s)
            except HistoryCompacted as exc:
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                          "reason": "Expired", "message": f"too old resource version: {exc}"}
                yield json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"
                return
            if generation != self._generation:
                return
            for version, kind, obj in events:
                yield json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                since = version
