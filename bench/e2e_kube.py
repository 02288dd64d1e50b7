"""The API side of bench/e2e_scheduling.py: a lean HTTPS client for creating objects in bulk, a pod
watch that stamps when each pod is seen bound, and the check of every recorded assignment.

Why not the generated Kubernetes client for creating: the bench creates thousands of objects "at
once", and the generated client's model validation and serialisation would make the creation, not
the scheduling, the slow part. Here a manifest is one ``orjson.dumps`` and one pooled TLS request.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import urllib3
import yaml

from gpupool.api.annotations import AnnotationError, decode_assignment
from gpupool.core.units import COMPUTE_PER_CARD

ASSIGNMENT = "gpupool.io/assignment-v1"
WATCH_TIMEOUT_S = 3600


class ApiError(RuntimeError):
    """The apiserver refused a request the bench needs (the message carries its answer)."""


class Api:
    """Bearer-token HTTPS requests to one apiserver, over a pool of kept-alive connections."""

    def __init__(self, server: str, token: str, ca_cert: Path, connections: int = 32) -> None:
        self.server = server.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                        "Accept": "application/json"}
        self.http = urllib3.PoolManager(num_pools=4, maxsize=connections, ca_certs=str(ca_cert),
                                        cert_reqs="CERT_REQUIRED", retries=False,
                                        timeout=urllib3.Timeout(connect=10, read=60))

    def call(self, method: str, path: str, body: Any = None, ok: Sequence[int] = (200, 201),
             accept: str | None = None) -> Any:
        data = None if body is None else orjson.dumps(body)
        headers = self.headers if accept is None else {**self.headers, "Accept": accept}
        answer = self.http.request(method, self.server + path, body=data, headers=headers)
        if answer.status not in ok:
            raise ApiError(f"{method} {path}: {answer.status} {answer.data[:300]!r}")
        return orjson.loads(answer.data) if answer.data else None

    def create_all(self, path: str, docs: Sequence[dict[str, Any]], threads: int,
                   created: dict[str, float] | None = None) -> float:
        """POST every document with ``threads`` clients at once; the time the first was sent.
        ``created``, if given, gets each document's name and when the apiserver answered its POST."""
        def post(doc: dict[str, Any]) -> None:
            self.call("POST", path, doc)
            if created is not None:
                created[doc["metadata"]["name"]] = time.monotonic()

        started = time.monotonic()
        with ThreadPoolExecutor(threads, thread_name_prefix="bench-create") as pool:
            list(pool.map(post, docs))
        return started

    def list_items(self, path: str) -> tuple[list[dict[str, Any]], str]:
        """The items of a list and its resourceVersion (to watch from)."""
        doc = self.call("GET", path)
        return doc["items"], doc["metadata"]["resourceVersion"]


CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def install_crds(api: Api, files: Iterable[Path], timeout: float = 60.0) -> list[str]:
    """Create the CustomResourceDefinitions of ``files`` (gpupool's deploy/crds) and wait until the
    apiserver serves each (``Established``); their names.

    As every install does (Helm, kustomize): without them the extender's GpuQuota and ResourceGroup
    watches are answered 404 and retried every second for the whole run, CPU no cluster spends."""
    names = []
    for path in files:
        doc = yaml.safe_load(path.read_text())
        api.call("POST", CRD_PATH, doc)
        names.append(doc["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            conditions = (api.call("GET", f"{CRD_PATH}/{name}").get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise ApiError(f"CRD {name} not Established after {timeout:.0f} s")
            time.sleep(0.2)
    return names


class BoundWatch(threading.Thread):
    """Watches the pods of a namespace and stamps (``time.monotonic``) when each is first seen bound,
    and when first seen Running (on KWOK's nodes, its ``pod-ready`` stage).

    One watch stream, opened before the pods are created, so a bind is stamped when the apiserver
    tells its watchers, as kube-scheduler's informers learn it. A stream the apiserver ends is
    resumed from the last event's resourceVersion (``reconnects``): a fresh apiserver's watch cache
    gives each watcher a channel of 10 events, and closes one that falls behind a burst of pod
    creations (``Forcing pods watcher close due to unresponsiveness``), as it does the informers of
    kube-scheduler, KWOK and the extender, which resume the same way. A resourceVersion too old to
    resume from (410) is answered with a new list (``relists``; its binds are stamped when listed).
    """

    def __init__(self, api: Api, namespace: str, resource_version: str) -> None:
        super().__init__(name="bench-bound-watch", daemon=True)
        self.api = api
        self.namespace = namespace
        self.version = resource_version
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.node: dict[str, str] = {}
        self.changed = threading.Condition()
        self.failure: str | None = None
        self.stopping = False
        self.reconnects = 0
        self.relists = 0

    def run(self) -> None:
        try:
            while not self.stopping:
                self._stream()
                self.reconnects += 1
        except Exception as exc:  # the waiter reports it instead of waiting forever
            if not self.stopping:
                self.failure = f"{type(exc).__name__}: {exc}"
        with self.changed:
            self.changed.notify_all()

    def _stream(self) -> None:
        """One watch request from :attr:`version`, until the apiserver ends it."""
        path = (f"/api/v1/namespaces/{self.namespace}/pods?watch=1&allowWatchBookmarks=true"
                f"&resourceVersion={self.version}&timeoutSeconds={WATCH_TIMEOUT_S}")
        answer = self.api.http.request("GET", self.api.server + path, headers=self.api.headers,
                                       preload_content=False, timeout=urllib3.Timeout(connect=10, read=WATCH_TIMEOUT_S))
        if answer.status == 410:
            self._relist()
            return
        if answer.status != 200:
            raise ApiError(f"watch: {answer.status} {answer.read()[:300]!r}")
        for line in answer:
            if not line.strip():
                continue
            event = orjson.loads(line)
            if event.get("type") == "ERROR":
                if (event.get("object") or {}).get("code") == 410:
                    self._relist()
                    return
                raise ApiError(f"watch ended: {event.get('object')}")
            self._pod(event["object"])

    def _relist(self) -> None:
        items, self.version = self.api.list_items(f"/api/v1/namespaces/{self.namespace}/pods")
        self.relists += 1
        for pod in items:
            self._pod(pod)

    def _pod(self, pod: dict[str, Any]) -> None:
        self.version = pod["metadata"].get("resourceVersion") or self.version
        if "name" not in pod["metadata"]:  # a bookmark: only its resourceVersion
            return
        name, node = pod["metadata"]["name"], (pod.get("spec") or {}).get("nodeName")
        if node and name not in self.bound:
            with self.changed:
                self.bound[name] = time.monotonic()
                self.node[name] = node
                self.changed.notify_all()
        if (pod.get("status") or {}).get("phase") == "Running" and name not in self.running:
            self.running[name] = time.monotonic()

    def wait_bound(self, names: Iterable[str], timeout: float) -> list[str]:
        """Wait until every pod of ``names`` is bound or ``timeout`` passes; the ones still unbound."""
        wanted = set(names)
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                missing = [n for n in wanted if n not in self.bound]
                left = deadline - time.monotonic()
                if not missing or left <= 0 or self.failure is not None or not self.is_alive():
                    return sorted(missing)
                self.changed.wait(min(left, 1.0))


def card_overcommits(pods: Iterable[dict[str, Any]], card_mib: int) -> tuple[int, int]:
    """Cards whose recorded assignments add up to more memory or compute than the card has, and
    assignments that name another node than the one the pod is bound to (or cannot be read)."""
    memory: dict[tuple[str, int], int] = defaultdict(int)
    compute: dict[tuple[str, int], int] = defaultdict(int)
    wrong = 0
    for pod in pods:
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ASSIGNMENT)
        if not text:
            continue
        try:
            assignment = decode_assignment(text)
        except AnnotationError:
            wrong += 1
            continue
        if assignment.node != (pod.get("spec") or {}).get("nodeName"):
            wrong += 1
            continue
        for container in assignment.containers:
            if container.init:
                continue
            for card in container.cards:
                memory[(assignment.node, card.index)] += card.memory_mib
                compute[(assignment.node, card.index)] += card.compute
    over = {key for key, used in memory.items() if used > card_mib}
    over |= {key for key, used in compute.items() if used > COMPUTE_PER_CARD}
    return len(over), wrong


def forced_watch_closes(apiserver_log: Path) -> dict[str, int]:
    """Watches the apiserver ended because their client fell behind (``Forcing ... watcher close due
    to unresponsiveness``), by resource and field selector; each client resumed from its last event."""
    found: dict[str, int] = {}
    for line in apiserver_log.read_text(errors="replace").splitlines():
        if "due to unresponsiveness" in line:
            key = line.split("key: ", 1)[-1].split(". len(", 1)[0].replace('"', "").replace(", labels: ", " ")
            found[key] = found.get(key, 0) + 1
    return found
