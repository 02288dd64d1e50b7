"""List+watch of nodes and pods into the :class:`ClusterCache`, with the official client.

Why hand-rolled (no informer in the Python client): the loop is short and its rules matter for
correctness:

* list first (paginated, raw JSON), replace the cache's view, remember the list's resourceVersion;
* watch from that resourceVersion, applying each event and advancing the version (bookmarks too);
* a watch that ends normally (server timeout) resumes from the last version;
* ``410 Gone`` (the version was compacted away) means events were lost: list again. The apiserver
  says so either as an HTTP 410 or, for a watch, as an ``ERROR`` event inside a 200 stream;
* any other error backs off and resumes; the cache keeps answering from what it has.

The watch stream is read here, line by line, rather than through ``kubernetes.watch.Watch``: with
``deserialize=False`` (raw dicts, much cheaper than client models) that helper fails on the
``ERROR`` event with a ``KeyError`` instead of raising 410, and the loop then retried the same
expired version forever and never listed again.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpupool.adapters.k8s.cache import ClusterCache

log = logging.getLogger(__name__)

ListFn = Callable[..., Any]


class ListWatch:
    """One resource's list+watch loop on a daemon thread."""

    def __init__(self, kind: str, list_fn: ListFn, on_list: Callable[[Iterable[dict[str, Any]]], None],
                 on_event: Callable[[str, dict[str, Any]], None], *, stop: threading.Event,
                 page_size: int = 500, watch_timeout_s: int = 300, backoff_s: float = 1.0) -> None:
        self.kind = kind
        self.list_fn = list_fn
        self.on_list = on_list
        self.on_event = on_event
        self.stop = stop
        self.page_size = page_size
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.resource_version = ""
        self.relists = 0
        self.thread = threading.Thread(target=self._run, name=f"gpupool-watch-{kind}", daemon=True)

    def start(self) -> ListWatch:
        self.thread.start()
        return self

    def list_once(self) -> None:
        """A full paginated list applied to the cache; sets :attr:`resource_version`."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self.page_size, "_preload_content": False}
            if token:
                kwargs["_continue"] = token
            page = json.loads(self.list_fn(**kwargs).data)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self.resource_version = str(meta.get("resourceVersion") or "")
                break
        self.on_list(items)
        self.relists += 1

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        need_list = True
        while not self.stop.is_set():
            try:
                if need_list:
                    self.list_once()
                    need_list = False
                need_list = self.watch_once()
            except ApiException as exc:
                if exc.status == 410:
                    log.info("%s: resourceVersion %s expired (410 Gone); listing again",
                             self.kind, self.resource_version)
                    need_list = True
                    continue
                log.warning("%s watch failed: %s; retrying", self.kind, exc)
                self.stop.wait(self.backoff_s)
            except Exception as exc:  # network errors, decode errors: back off and resume
                log.warning("%s watch failed: %s: %s; retrying", self.kind, type(exc).__name__, exc)
                self.stop.wait(self.backoff_s)

    def watch_once(self) -> bool:
        """One watch request from :attr:`resource_version`, applied event by event until the server
        ends it; returns True when the version has expired (410 Gone) and a new list is needed."""
        resp = self.list_fn(watch=True, resource_version=self.resource_version,
                            timeout_seconds=self.watch_timeout_s, allow_watch_bookmarks=True,
                            _preload_content=False)
        try:
            for line in _lines(resp):
                event = json.loads(line)
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
                if version:
                    self.resource_version = str(version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.on_event(kind, obj)
                if self.stop.is_set():
                    break
        finally:
            resp.close()
            resp.release_conn()
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


def apply_node_event(cache: ClusterCache, kind: str, obj: dict[str, Any]) -> None:
    """One node event into the cache."""
    if kind == "DELETED":
        cache.remove_node(str((obj.get("metadata") or {}).get("name")))
    else:
        cache.upsert_node(obj)


def apply_pod_event(cache: ClusterCache, kind: str, obj: dict[str, Any]) -> None:
    """One pod event into the cache."""
    if kind == "DELETED":
        cache.remove_pod(obj)
    else:
        cache.upsert_pod(obj)


def start_watches(cache: ClusterCache, core_v1: Any, stop: threading.Event) -> tuple[ListWatch, ListWatch]:
    """Start the node and pod watches feeding ``cache``; returns them (for status and tests)."""
    nodes = ListWatch("nodes", core_v1.list_node, cache.replace_nodes,
                      lambda kind, obj: apply_node_event(cache, kind, obj), stop=stop).start()
    pods = ListWatch("pods", core_v1.list_pod_for_all_namespaces, cache.replace_pods,
                     lambda kind, obj: apply_pod_event(cache, kind, obj), stop=stop).start()
    return nodes, pods
