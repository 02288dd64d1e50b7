"""The bind part of bench/extender.py: ``--binds`` pods bound by ``--bind-threads`` threads.

Against the real kube-apiserver v1.20.2 of ``gpupool testenv`` (``--apiserver real``; ``auto`` uses
it when its binaries are built, and says loudly on stderr when it falls back), or the in-process
:class:`FakePodApi` (``fake``). The result names the API it used (``"apiserver": "real"|"fake"``):
a figure from the fake says nothing about the apiserver's cost.

Against the real apiserver the CPU time of etcd, kube-apiserver and this process during the binds
is reported too (``cpu_s``), to say where the time of a bind goes on a small machine.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.extender_cluster import CARD_MIB, SHAPES, node_json, pod_json
from gpupool.api.annotations import decode_assignment
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.testing.fake_api import FakePodApi

APISERVER_MODES = ("auto", "real", "fake")
CLIENT_POOL_SIZE = 32
"""Connections the API client keeps (urllib3's default of 4 would serialise 8 binders)."""
BIND_SHAPES = SHAPES[:5]
"""Slices only: several pods share a card, so binds race for the same space."""


@dataclass(frozen=True)
class Backend:
    """The API the binds go to: ``kind`` is ``real`` or ``fake``; ``plane`` and ``core`` only when real."""

    kind: str
    against: str
    plane: Any = None
    core: Any = None


def real_backend(build: bool) -> Backend | str:
    """A control plane from gpupool testenv, or why there is none here.

    The binaries' paths come from the testenv build itself (the fake CRI binary is named by its
    source's hash); ``build`` lets it build them first when they are missing (minutes, once).
    """
    from kubernetes import client

    from gpupool.kube.client_config import api_configuration
    from gpupool.testenv.build import build_impossible_reason, cached_binaries, ensure_binaries
    from gpupool.testenv.controlplane import start_control_plane
    from gpupool.testenv.errors import TestenvError

    binaries = cached_binaries()
    if binaries is None and not build:
        return "the gpupool testenv binaries are not built (`gpupool testenv up` or --apiserver real builds them)"
    if binaries is None:
        reason = build_impossible_reason()
        if reason is not None:
            return reason
        try:
            binaries = ensure_binaries(lambda line: print(line, file=sys.stderr))
        except TestenvError as exc:
            return f"the gpupool testenv binaries could not be built: {exc}"
    plane = start_control_plane(binaries, with_scheduler=False)
    configuration = api_configuration(str(plane.kubeconfig))  # as the extender loads it
    configuration.connection_pool_maxsize = CLIENT_POOL_SIZE
    return Backend("real", f"real kube-apiserver {binaries.version} (gpupool testenv)", plane,
                   client.CoreV1Api(client.ApiClient(configuration)))


def backend(mode: str) -> Backend:
    """The API for ``mode``; ``real`` that cannot start exits, ``auto`` falls back loudly."""
    if mode == "fake":
        return Backend("fake", "in-process FakePodApi")
    found = real_backend(build=mode == "real")
    if isinstance(found, Backend):
        return found
    if mode == "real":
        raise SystemExit(f"--apiserver real: no real apiserver: {found}")
    print(f"WARNING: binds measured against the in-process FakePodApi, NOT a real apiserver: {found}",
          file=sys.stderr)
    return Backend("fake", f"in-process FakePodApi (no real apiserver: {found})")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``), 0 where unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_snapshot(found: Backend) -> dict[str, float]:
    times = os.times()
    snapshot = {"bench": times.user + times.system}
    if found.plane is not None:
        snapshot["etcd"] = process_cpu_s(found.plane.etcd.pid)
        snapshot["kube_apiserver"] = process_cpu_s(found.plane.apiserver.pid)
    return snapshot


def _seed_pods(found: Backend, cache: ClusterCache, names: list[str], cards: int, count: int,
               rng: random.Random) -> tuple[Any, dict[str, str]]:
    """Create the nodes and pods; the cache gets the pods as the extender's watch would deliver them."""
    shapes = [rng.choice(BIND_SHAPES) for _ in range(count)]
    if found.core is not None:
        from gpupool.kube.podapi import KubePodApi

        core = found.core
        for n in names:
            core.create_node(node_json(n, cards))
        for i, shape in enumerate(shapes):
            core.create_namespaced_pod("default", pod_json(f"b{i}", shape))
        listed = json.loads(core.list_namespaced_pod("default", _preload_content=False).data)["items"]
        cache.replace_pods(listed)
        return KubePodApi(core), {p["metadata"]["name"]: p["metadata"]["uid"] for p in listed}
    api = FakePodApi()
    for i, shape in enumerate(shapes):
        api.create_pod(pod_json(f"b{i}", shape))
    cache.replace_pods(api.list_pods())
    api.listeners.append(lambda kind, p: cache.upsert_pod(p))
    return api, {p["metadata"]["name"]: p["metadata"]["uid"] for p in api.list_pods()}


def double_booked(pods: list[dict[str, Any]]) -> int:
    """Cards whose recorded assignments add up to more than the card's memory."""
    used: dict[tuple[str, int], int] = defaultdict(int)
    for p in pods:
        text = ((p.get("metadata") or {}).get("annotations") or {}).get("gpupool.io/assignment-v1")
        if text:
            a = decode_assignment(text)
            for c in a.containers:
                for ref in c.cards:
                    used[(a.node, ref.index)] += ref.memory_mib
    return sum(1 for v in used.values() if v > CARD_MIB)


def binds(count: int, nodes: int, cards: int, mode: str, rng: random.Random, *, threads: int = 8,
          one_write: bool = True) -> dict[str, Any]:
    """Bind ``count`` pods to random nodes of ``nodes`` with ``threads`` binders; the result's keys
    are what bench/extender.py prints."""
    found = backend(mode)
    names = [f"bind-node-{i}" for i in range(nodes)]
    cache = ClusterCache(policy="gpupool")
    cache.replace_nodes(node_json(n, cards) for n in names)
    cache.replace_pods([])
    try:
        api, uids = _seed_pods(found, cache, names, cards, count, rng)
        binder = Binder(cache, api, annotate_in_binding=one_write)
        targets = [names[rng.randrange(nodes)] for _ in range(count)]
        before = _cpu_snapshot(found)
        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(lambda i: binder.bind("default", f"b{i}", uids[f"b{i}"], targets[i]),
                                    range(count)))
        seconds = time.perf_counter() - started
        after = _cpu_snapshot(found)
        if found.core is not None:
            pods = json.loads(found.core.list_namespaced_pod("default", _preload_content=False).data)["items"]
        else:
            pods = api.list_pods()
        ok = sum(1 for r in results if r.ok)
        return {
            "binds_per_s": round(count / seconds, 1),
            "binds_ok": ok,
            "binds_refused": count - ok,
            "double_booked_cards": double_booked(pods),
            "binds_against": found.against,
            "apiserver": found.kind,
            "bind_threads": threads,
            "bind_writes": 1 if one_write else 2,
            "bind_cpu_s": {k: round(after[k] - before[k], 2) for k in after},
            "bind_wall_s": round(seconds, 2),
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
    finally:
        if found.plane is not None:
            found.plane.stop()
