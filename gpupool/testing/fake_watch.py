"""``list_pod_for_all_namespaces`` of the official client, served from a :class:`FakePodApi`.

Why: the watch loop (:mod:`gpupool.extender.watch`) has rules that only matter when the stream
misbehaves: resume after a server timeout, list again after ``410 Gone``. This stand-in speaks the
client's calling convention with ``_preload_content=False`` (a list answer with ``.data``, a watch
answer whose ``.stream()`` yields newline-separated JSON events) so those rules are tested in
process. Like the apiserver, a watch from a compacted resourceVersion answers HTTP 200 with one
``ERROR`` event of code 410; :meth:`FakeListWatch.fail_next_watch` gives an HTTP error instead.

The one field selector the products use, ``spec.nodeName=<node>`` (the node agent's own pods), is
honoured as the apiserver does: the list and the watch carry only matching pods, and a pod that
starts matching (bound to the node) arrives as ``ADDED``. Any other selector is refused, so a test
cannot silently watch more than it asked for.
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
        self._fail_lists: list[int] = []
        self.list_versions: list[str | None] = []
        """The ``resourceVersion`` each list asked for (``None``: a quorum read)."""

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

    def fail_next_lists(self, status: int, times: int = 1) -> None:
        """The next ``times`` list calls raise ``ApiException(status)``."""
        self._fail_lists = [status] * times

    # -------------------------------------------------------------------------- client side
    def list_pod_for_all_namespaces(self, *, watch: bool = False, resource_version: str | None = None,
                                    timeout_seconds: int | None = None, limit: int | None = None,
                                    _continue: str | None = None, field_selector: str | None = None,
                                    **_: Any) -> _ListAnswer | _WatchAnswer:
        node = _selected_node(field_selector)
        if watch:
            return self._watch(int(resource_version or 0), float(timeout_seconds or 300), node)
        self.list_versions.append(resource_version)
        return self._list(limit, _continue, node)

    def _list(self, limit: int | None, token: str | None, node: str | None) -> _ListAnswer:
        self.lists += 1
        if self._fail_lists:
            from kubernetes.client.exceptions import ApiException

            raise ApiException(status=self._fail_lists.pop(), reason="injected by FakeListWatch")
        version = self.api.resource_version
        pods = sorted((p for p in self.api.list_pods() if node is None or _on_node(p, node)),
                      key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
        start = int(token or 0)
        end = len(pods) if not limit else min(len(pods), start + limit)
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        if end < len(pods):
            meta["continue"] = str(end)
        return _ListAnswer({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": pods[start:end]})

    def _watch(self, since: int, timeout_s: float, node: str | None) -> _WatchAnswer:
        self._gate.wait()
        self.watches += 1
        if self._fail_with is not None:
            from kubernetes.client.exceptions import ApiException

            status, self._fail_with = self._fail_with, None
            raise ApiException(status=status, reason="injected by FakeListWatch")
        with self._lock:
            self._open_streams += 1
            generation = self._generation
        return _WatchAnswer(self._events(since, timeout_s, generation, node), self._closed)

    def _closed(self) -> None:
        with self._lock:
            self._open_streams -= 1
            self._lock.notify_all()

    def _events(self, since: int, timeout_s: float, generation: int, node: str | None) -> Iterator[bytes]:
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
                selected = kind if node is None else self._selected(version, kind, obj, node)
                if selected is not None:
                    yield json.dumps({"type": selected, "object": obj}).encode() + b"\n"
                since = version

    def _selected(self, version: int, kind: str, obj: dict[str, Any], node: str) -> str | None:
        """The event a watch selecting ``node``'s pods carries for this change, if any: a pod that
        starts matching is ADDED, one that stops matching DELETED (the apiserver's rule)."""
        meta = obj["metadata"]
        before = self.api.version_before(meta["namespace"], meta["name"], version)
        now = _on_node(obj, node)
        was = kind != "ADDED" and (now if before is None else _on_node(before, node))
        if kind == "MODIFIED" and was != now:
            return "ADDED" if now else "DELETED"
        return kind if now else None


def _selected_node(field_selector: str | None) -> str | None:
    """The node of a ``spec.nodeName=<node>`` selector; ``None`` without one."""
    if not field_selector:
        return None
    field, sep, value = field_selector.partition("=")
    if field != "spec.nodeName" or not sep or "," in value:
        raise ValueError(f"FakeListWatch supports only the field selector spec.nodeName=<node>, "
                         f"not {field_selector!r}")
    return value


def _on_node(pod: dict[str, Any], node: str) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName") == node)
