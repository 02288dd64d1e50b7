"""A list+watch loop over one resource with the official client (blocking, on a daemon thread).

Used by both products: the extender watches every node and pod (:mod:`gpupool.extender.watch`),
the node agent the pods of its own node (:mod:`gpupool.nodeagent.pod_cache`). Why hand-rolled (no
informer in the Python client): the loop is short and its rules matter for correctness:

* list first (paginated, raw JSON), replace the consumer's view, remember the list's resourceVersion;
* watch from that resourceVersion, applying each event and advancing the version (bookmarks too);
* a watch that ends normally (server timeout) resumes from the last version;
* ``410 Gone`` (the version was compacted away) means events were lost: list again. The apiserver
  says so either as an HTTP 410 or, for a watch, as an ``ERROR`` event inside a 200 stream;
* any other error backs off (:class:`Backoff`: doubling up to a cap, reset by the next success)
  and resumes; the consumer keeps answering from what it has;
* :meth:`ListWatch.catch_up` (a new extender leader, see :mod:`gpupool.extender.handover`) lists
  from etcd *now* and makes the view at least that fresh, whatever the watch has delivered so far.

Lists go out without a resourceVersion unless ``list_resource_version`` says otherwise: the
apiserver then serves them from etcd with a quorum read (the official client sends no
``resourceVersion`` parameter when none is given), so a list's version covers every write
committed before the list was served. The watch cache (``resourceVersion=0``) could answer from
behind; it is the right choice where many clients list a field-selected slice (every node agent at
a DaemonSet roll-out), since etcd has no field index and would scan every pod for each of them.

The watch stream is read here, line by line, rather than through ``kubernetes.watch.Watch``: with
``deserialize=False`` (raw dicts, much cheaper than client models) that helper fails on the
``ERROR`` event with a ``KeyError`` instead of raising 410, and the loop then retried the same
expired version forever and never listed again.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpupool.kube.json_decode import loads

log = logging.getLogger(__name__)

ListFn = Callable[..., Any]


class Backoff:
    """Delays between failed attempts: ``initial_s`` doubling up to ``max_s``, each shortened by
    up to ``jitter`` of itself at random (many clients failing together then retry apart);
    :meth:`reset` after a success starts again from ``initial_s``."""

    def __init__(self, initial_s: float, max_s: float | None = None, jitter: float = 0.0,
                 rng: random.Random | None = None) -> None:
        if initial_s <= 0 or not 0.0 <= jitter < 1.0:
            raise ValueError(f"backoff needs initial_s > 0 and 0 <= jitter < 1, got {initial_s}, {jitter}")
        self.initial_s = initial_s
        self.max_s = max(initial_s, max_s if max_s is not None else initial_s)
        self.jitter = jitter
        self._rng = rng or random.Random()
        self._next_s = initial_s

    def next(self) -> float:
        """The delay before the next attempt; the one after it doubles (up to the cap)."""
        delay = self._next_s
        self._next_s = min(self.max_s, self._next_s * 2)
        return delay * (1.0 - self.jitter * self._rng.random())

    def reset(self) -> None:
        self._next_s = self.initial_s


class ListWatch:
    """One resource's list+watch loop on a daemon thread.

    ``list_fn`` is the client's list call for the resource (``list_node``,
    ``list_pod_for_all_namespaces``), with any selector already bound (``functools.partial``), so
    the list and the watch select the same objects. ``backoff`` defaults to a constant
    ``backoff_s``.
    """

    def __init__(self, kind: str, list_fn: ListFn, on_list: Callable[[Iterable[dict[str, Any]]], None],
                 on_event: Callable[[str, dict[str, Any]], None], *, stop: threading.Event,
                 page_size: int = 500, watch_timeout_s: int = 300, backoff_s: float = 1.0,
                 backoff: Backoff | None = None, list_resource_version: str | None = None) -> None:
        self.kind = kind
        self.list_fn = list_fn
        self.on_list = on_list
        self.on_event = on_event
        self.stop = stop
        self.page_size = page_size
        self.watch_timeout_s = watch_timeout_s
        self.backoff = backoff or Backoff(backoff_s)
        self.list_resource_version = list_resource_version
        self.resource_version = ""
        self.relists = 0
        self.catch_ups = 0
        self.failures = 0
        """Failed list or watch requests (each followed by a back-off), 410 Gone not counted."""
        # Lists and events are applied under this lock; a list applied by catch_up() bumps the
        # generation, and a watch stream opened before it drops its remaining events (older, or
        # fetched again by the next watch from the list's version) instead of applying them over
        # the fresher list.
        self._apply = threading.Lock()
        self._generation = 0
        self.thread = threading.Thread(target=self._run, name=f"gpupool-watch-{kind}", daemon=True)

    def start(self) -> ListWatch:
        self.thread.start()
        return self

    def _fetch(self) -> tuple[list[dict[str, Any]], str]:
        """A full paginated list (a quorum read unless ``list_resource_version`` is set) and the
        list's version."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self.page_size, "_preload_content": False}
            if self.list_resource_version is not None:
                kwargs["resource_version"] = self.list_resource_version
            if token:
                kwargs["_continue"] = token
            page = loads(self.list_fn(**kwargs).data)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    def _adopt(self, items: list[dict[str, Any]], version: str) -> bool:
        """Apply a list unless the view is already at or past its version; returns whether applied."""
        with self._apply:
            if at_least(self.resource_version, version):
                return False  # a newer list or the watch got further meanwhile
            self._generation += 1
            self.on_list(items)
            self.resource_version = version
            return True

    def list_once(self) -> None:
        """A full paginated list applied to the cache; sets :attr:`resource_version`."""
        items, version = self._fetch()
        self._adopt(items, version)
        self.relists += 1

    def catch_up(self) -> str:
        """Make the view include every write committed before this call; returns the list's version.

        Why not just wait for the watch to pass the quorum version: a watch delivers nothing while
        no pod changes (bookmarks of v1.20 come only near the watch's timeout), so it might never
        say that it has. The list is applied only when the watch is behind it.
        """
        items, version = self._fetch()
        if self._adopt(items, version):
            self.catch_ups += 1
            log.info("%s: caught up with a quorum list at resourceVersion %s", self.kind, version)
        return version

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        need_list = True
        while not self.stop.is_set():
            try:
                if need_list:
                    self.list_once()
                    self.backoff.reset()
                    need_list = False
                need_list = self.watch_once()
                self.backoff.reset()
            except ApiException as exc:
                if exc.status == 410:
                    log.info("%s: resourceVersion %s expired (410 Gone); listing again",
                             self.kind, self.resource_version)
                    need_list = True
                    continue
                self._back_off(f"{exc.status} {exc.reason}")
            except Exception as exc:  # network errors, decode errors: back off and resume
                self._back_off(f"{type(exc).__name__}: {exc}")

    def _back_off(self, error: str) -> None:
        self.failures += 1
        delay = self.backoff.next()
        log.warning("%s list/watch failed: %s; retrying in %.1f s", self.kind, error, delay)
        self.stop.wait(delay)

    def watch_once(self) -> bool:
        """One watch request from :attr:`resource_version`, applied event by event until the server
        ends it; returns True when the version has expired (410 Gone) and a new list is needed."""
        with self._apply:
            since, generation = self.resource_version, self._generation
        resp = self.list_fn(watch=True, resource_version=since,
                            timeout_seconds=self.watch_timeout_s, allow_watch_bookmarks=True,
                            _preload_content=False)
        try:
            for line in _lines(resp):
                event = loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        log.info("%s watch: resourceVersion %s expired (410 Gone); listing again",
                                 self.kind, self.resource_version)
                        return True
                    raise WatchError(f"{self.kind} watch: error event {obj.get('code')} "
                                     f"{obj.get('reason')}: {obj.get('message')}")
                version = (obj.get("metadata") or {}).get("resourceVersion")
                with self._apply:
                    if generation != self._generation:
                        return False  # a catch-up list replaced the view: watch on from its version
                    if version:
                        self.resource_version = str(version)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.on_event(kind, obj)
                self.backoff.reset()  # the stream works: a later failure starts from a short delay
                if self.stop.is_set():
                    break
        finally:
            resp.close()
            resp.release_conn()
        return False


def at_least(version: str, other: str) -> bool:
    """Whether resourceVersion ``version`` is at or after ``other``.

    Kubernetes calls resourceVersions opaque, but etcd's are its revision numbers, compared here only
    to tell which of two lists (or a list and the watch) is fresher; anything not a number counts as
    "not known to be fresher", so the list is applied.
    """
    try:
        return int(version) >= int(other)
    except ValueError:
        return False


class WatchError(RuntimeError):
    """The watch stream carried an ERROR event other than 410 Gone."""


def _lines(resp: Any) -> Iterator[bytes]:
    """The non-empty lines of a streamed answer (one JSON event per line)."""
    pending = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        if isinstance(chunk, str):
            chunk = chunk.encode()
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending
