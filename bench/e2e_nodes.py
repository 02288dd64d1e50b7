"""The nodes of bench/e2e_scheduling.py: simulated by KWOK (the default), or bare Node objects.

KWOK (:mod:`gpupool.testenv.kwok`) plays the kubelet of every node: the nodes are created with
their capacity, allocatable and the gpupool inventory annotation (bench/e2e_objects.py) but no
conditions, KWOK's ``node-initialize`` stage makes them Ready, it renews each node's Lease every
``lease_duration_s / 4`` (10 s, as a kubelet) and moves every pod bound to them to Running. So the
cluster carries the steady API load of that many nodes (at 5,000 nodes, 500 Lease renewals per
second) and of pods starting, which bare Node objects (``--no-kwok``: created Ready, never renewed;
nothing in the bench's cluster watches Leases) do not.

Readiness is read from the apiserver's Table form of the node list (``includeObject=None``: a
name and a status column per node, not the whole Node with its inventory).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.e2e_kube import Api
from bench.e2e_objects import NodeShape, node_manifest, node_spec

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


@dataclass
class Nodes:
    """The nodes created, what KWOK process manages them (``None`` for bare Node objects), and how
    long creating them and (with KWOK) their becoming Ready took."""

    count: int
    kwok: Any = None
    timings: dict[str, float | None] = field(default_factory=dict)

    def stop(self) -> None:
        if self.kwok is not None:
            self.kwok.stop()


def node_name(index: int) -> str:
    return f"node-{index:05d}"


def ready_count(api: Api) -> tuple[int, int]:
    """(Ready nodes, all nodes), from the Table form of the node list."""
    table = api.call("GET", "/api/v1/nodes?includeObject=None", accept=TABLE)
    column = next(i for i, c in enumerate(table["columnDefinitions"]) if c["name"] == "Status")
    rows = table.get("rows") or []
    return sum(1 for row in rows if str(row["cells"][column]).split(",")[0] == "Ready"), len(rows)


def wait_ready(api: Api, count: int, timeout: float, log: Callable[[str], None], poll_s: float = 1.0) -> float | None:
    """Seconds until ``count`` nodes are Ready, or ``None`` after ``timeout``."""
    started = time.monotonic()
    last_said = started
    while True:
        ready, _ = ready_count(api)
        now = time.monotonic()
        if ready >= count:
            return now - started
        if now - started > timeout:
            log(f"only {ready} of {count} nodes Ready after {timeout:.0f} s")
            return None
        if now - last_said > 15:
            log(f"{ready} of {count} nodes Ready")
            last_said = now
        time.sleep(poll_s)


def create_nodes(api: Api, plane: Any, shape: NodeShape, count: int, *, kwok: bool, threads: int,
                 lease_duration_s: int, timeout: float, log: Callable[[str], None]) -> Nodes:
    """``count`` nodes of ``shape``: with KWOK started first (so it sees each node as it is created)
    and waited for until every node is Ready, or bare and created Ready."""
    if not kwok:
        heartbeat = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        manifests = [node_manifest(node_spec(node_name(i), shape), heartbeat) for i in range(count)]
        began = time.monotonic()
        api.create_all("/api/v1/nodes", manifests, threads)
        created = time.monotonic() - began
        log(f"{count} bare nodes created in {created:.1f} s")
        return Nodes(count, None, {"create_s": round(created, 2), "ready_s": None, "kwok_start_s": None})
    from gpupool.testenv.kwok import KwokOptions, ensure_kwok, managed_node, start_kwok

    install = ensure_kwok(log)
    began = time.monotonic()
    process = start_kwok(plane, options=KwokOptions(lease_duration_s=lease_duration_s), install=install,
                         log=log)
    nodes = Nodes(count, process, {"kwok_start_s": round(time.monotonic() - began, 2)})
    try:
        manifests = [managed_node(node_manifest(node_spec(node_name(i), shape), "")) for i in range(count)]
        began = time.monotonic()
        api.create_all("/api/v1/nodes", manifests, threads)
        created = time.monotonic() - began
        log(f"{count} KWOK nodes created in {created:.1f} s; waiting for them to be Ready")
        ready = wait_ready(api, count, timeout, log)
        if ready is None:
            raise RuntimeError(f"KWOK did not make {count} nodes Ready in {timeout:.0f} s; log {process.log_path}")
        ready += created
        log(f"{count} nodes Ready {ready:.1f} s after the first was created")
        nodes.timings |= {"create_s": round(created, 2), "ready_s": round(ready, 2)}
        return nodes
    except BaseException:
        nodes.stop()
        raise


def not_running(api: Api, namespace: str) -> bool:
    """Whether any pod of ``namespace`` is not Running (one item asked for, not the list)."""
    page = api.call("GET", f"/api/v1/namespaces/{namespace}/pods?fieldSelector=status.phase!%3DRunning&limit=1")
    return bool(page.get("items"))


def wait_running(api: Api, namespace: str, timeout: float) -> float | None:
    """Seconds until every pod of ``namespace`` is Running (KWOK's ``pod-ready``), or ``None``."""
    started = time.monotonic()
    while not_running(api, namespace):
        if time.monotonic() - started > timeout:
            return None
        time.sleep(0.5)
    return time.monotonic() - started
