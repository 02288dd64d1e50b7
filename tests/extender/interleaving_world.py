"""A fake apiserver whose writes can be scripted, and a watch the test delivers by hand, for the
interleaving tests of the extender's decision and bind path (tests/extender/test_bind_interleavings.py).

Why by hand and on one thread: the interleavings that matter are orders of a few steps (a bind's
reservation, its write, the watch's event, another pod's filter or bind in between). A hook that
runs the other pod's steps inside the first pod's write, and a watch that hands over events only
when told, give each order exactly and every time; threads and sleeps would give it by chance.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.annotations import decode_assignment
from gpupool.api.names import ALIYUN_GPU_MEM, ResourceNames
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import BindResult, ExtenderService, ExtenderSettings
from gpupool.kube.podapi import ApiError, NoAnswerError
from gpupool.kube.translate import pod_request
from gpupool.testing.fake_api import FakePodApi
from gpupool.testing.kube_objects import node, pod

NAMES = ResourceNames()
Hook = Callable[[], object]
CARD_MIB = 16384
CARD_COMPUTE = 1000
NODE = "n1"

APPLIED = "applied"
"""A write the apiserver applies and answers."""
LOST = "lost"
"""A write the apiserver applies whose answer never comes (the client times out)."""
DROPPED = "dropped"
"""A write that never reaches the apiserver and gets no answer (the client times out)."""


def server_error(status: int) -> str:
    """A write the apiserver applies and then answers with HTTP ``status`` (etcd's "request timed
    out" is a 500 after the write was proposed; a 504 says the request may still be processed)."""
    return f"applied-{status}"


def refused(status: int) -> str:
    """A write the apiserver refuses with HTTP ``status`` without applying it."""
    return f"refused-{status}"


class ScriptedApi:
    """A :class:`FakePodApi` (a ``PodApi``) whose next writes of a pod follow a script.

    ``script(name, outcome, before=..., after=...)``: the pod's next write (a Binding, or a PATCH
    on the two-write path) has ``outcome`` (:data:`APPLIED`, :data:`LOST`, :data:`DROPPED`,
    :func:`server_error`, :func:`refused`); ``before`` runs first, while the bind that writes is
    between its reservation and its write, and ``after`` once the write is applied, before its
    answer (another pod's steps, the watch's events). Unscripted writes apply.
    """

    def __init__(self, api: FakePodApi) -> None:
        self.api = api
        self._scripts: dict[str, list[tuple[str, Hook | None, Hook | None]]] = defaultdict(list)
        self.writes: list[str] = []
        """``verb name`` of every write that reached the API, in order."""

    def script(self, name: str, outcome: str = APPLIED, *, before: Hook | None = None,
               after: Hook | None = None) -> None:
        self._scripts[name].append((outcome, before, after))

    def clear(self, name: str) -> None:
        """Forget what is scripted for the pod's next writes."""
        self._scripts.pop(name, None)

    def _write(self, verb: str, name: str, apply: Callable[[], Any]) -> Any:
        outcome, before, after = self._scripts[name].pop(0) if self._scripts[name] else (APPLIED, None, None)
        if before is not None:
            before()
        self.writes.append(f"{verb} {name}")
        if outcome.startswith("refused-"):
            raise ApiError(f"{verb} {name}: HTTP {outcome[8:]} refused", int(outcome[8:]))
        if outcome == DROPPED:
            raise NoAnswerError(f"{verb} {name}: no answer: ConnectTimeoutError")
        result = apply()
        if after is not None:
            after()
        if outcome == LOST:
            raise NoAnswerError(f"{verb} {name}: no answer: ReadTimeoutError")
        if outcome.startswith("applied-"):
            raise ApiError(f"{verb} {name}: HTTP {outcome[8:]} etcdserver: request timed out", int(outcome[8:]))
        return result

    def get_pod(self, namespace: str, name: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        return self.api.get_pod(namespace, name)

    def patch_pod_annotations(self, namespace: str, name: str, resource_version: str,
                              annotations: dict[str, str | None]) -> dict[str, Any]:
        result: dict[str, Any] = self._write("patch", name, lambda: self.api.patch_pod_annotations(
            namespace, name, resource_version, annotations))
        return result

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, *,
                 annotations: Mapping[str, str] | None = None, resource_version: str = "") -> None:
        self._write("bind", name, lambda: self.api.bind_pod(namespace, name, uid, node, annotations=annotations,
                                                            resource_version=resource_version))

    def create_pod_event(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        self.api.create_pod_event(namespace, name, uid, reason, message)


class HeldWatch:
    """Every change of the fake API, handed to the cache only when the test says (in order)."""

    def __init__(self, api: FakePodApi, cache: ClusterCache) -> None:
        self.cache = cache
        self.events: list[tuple[str, dict[str, Any]]] = []
        api.listeners.append(lambda kind, obj: self.events.append((kind, obj)))

    def deliver(self, count: int | None = None) -> None:
        """Hand the oldest ``count`` events (all when None) to the cache."""
        taken = self.events[:count] if count is not None else list(self.events)
        del self.events[:len(taken)]
        for kind, obj in taken:
            if kind == "DELETED":
                self.cache.remove_pod(obj)
            else:
                self.cache.upsert_pod(obj)


@dataclass
class World:
    """One node of ``cards`` cards, the extender (binpack, the shipped filter) on a scripted API
    whose watch runs only when delivered."""

    fake: FakePodApi
    api: ScriptedApi
    cache: ClusterCache
    watch: HeldWatch
    service: ExtenderService

    @classmethod
    def make(cls, cards: int = 2, *, one_write: bool = True, clock: Callable[[], float] | None = None,
             settings: ExtenderSettings | None = None, nodes: tuple[str, ...] = (NODE,)) -> World:
        fake = FakePodApi()
        api = ScriptedApi(fake)
        cache = ClusterCache(policy="binpack", clock=clock or time.time)
        cache.replace_nodes([node(name, [CARD_MIB] * cards) for name in nodes])
        cache.replace_pods([])
        watch = HeldWatch(fake, cache)
        service = ExtenderService(cache, Binder(cache, api, annotate_in_binding=one_write), settings=settings)
        return cls(fake, api, cache, watch, service)

    def create(self, obj: dict[str, Any]) -> None:
        self.fake.create_pod(obj)

    def filter(self, name: str) -> list[str]:
        """kube-scheduler's filter of the pod, with the pod as kube-scheduler's informer has it (the API's)."""
        obj = self.fake.get_pod("default", name)
        outcome = self.service.filter(pod_request(obj, self.cache.names), [NODE], pod=obj)
        assert outcome.error == ""
        return outcome.passed

    def bind(self, name: str, node_name: str = NODE) -> BindResult:
        return self.service.bind("default", name, f"uid-default-{name}", node_name)

    def free_mib(self, node_name: str = NODE) -> list[int]:
        return [u.memory_free for u in self.cache.state.card_usage(node_name)]

    def written(self, *, bound_only: bool = True) -> dict[tuple[str, int], tuple[int, int]]:
        """Memory and compute per (node, card) that the pods' assignments in the API hold (bound
        pods only unless ``bound_only`` is False; init containers as the node holds them: per card
        the larger of the init and the app containers)."""
        held: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
        for obj in self.fake.list_pods():
            text = (obj["metadata"].get("annotations") or {}).get(NAMES.assignment)
            if text is None or (bound_only and not obj["spec"].get("nodeName")):
                continue
            assignment = decode_assignment(text)
            spec = self.cache.node_spec_of(assignment.node)
            assert spec is not None
            placement = assignment.to_placement(f"default/{obj['metadata']['name']}", spec, 0, 0)
            for card, (mib, compute, _exclusive) in placement.held_per_card().items():
                held[(assignment.node, card)][0] += mib
                held[(assignment.node, card)][1] += compute
        return {where: (mib, compute) for where, (mib, compute) in sorted(held.items())}

    def over_committed(self, *, bound_only: bool = True) -> dict[tuple[str, int], tuple[int, int]]:
        """The cards whose written assignments exceed them (empty: none)."""
        return {where: used for where, used in self.written(bound_only=bound_only).items()
                if used[0] > CARD_MIB or used[1] > CARD_COMPUTE}


def limits(name: str, **values: int | str) -> dict[str, Any]:
    """A container with gpupool limits given by resource name."""
    return {"name": name, "image": "busybox", "resources": {"limits": {k: str(v) for k, v in values.items()}}}


def slice_of(name: str, mem_units: int, percent: int, cards: int = 1) -> dict[str, Any]:
    """``mem_units`` x 256 MiB and ``percent`` % of each of ``cards`` cards (as the GPU pod e2e asks)."""
    values: dict[str, int | str] = {NAMES.gpu_mem: mem_units, NAMES.gpu_core: percent}
    if cards > 1:
        values[NAMES.gpu_shared] = cards
    return limits(name, **values)


def gpu_pod_e2e_pods() -> dict[str, dict[str, Any]]:
    """The pods of tests/e2e/test_gpu_pod_e2e.py, same shares, in its creation order (``whole``
    first, alone; the other six at once)."""
    return {
        "whole": pod("whole", limits("main", **{NAMES.gpu: 1})),
        "shared": pod("shared", slice_of("main", 16, 30)),
        "multi": pod("multi", slice_of("worker", 8, 20), limits("helper", **{NAMES.gpu_mem: 4}),
                     {"name": "log-shipper", "image": "busybox"}),
        "span-a": pod("span-a", slice_of("main", 8, 20, cards=2)),
        "span-b": pod("span-b", slice_of("main", 8, 20, cards=2)),
        "gpushare": pod("gpushare", limits("main", **{ALIYUN_GPU_MEM: 2})),
        "with-init": pod("with-init", slice_of("main", 8, 20), init=[slice_of("warmup", 4, 10)]),
    }
