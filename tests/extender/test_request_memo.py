"""The translated requests the watch and the filter share (gpupool/extender/request_memo.py): the
same pod's later objects reuse its request unless a field the translation reads changed."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpupool.api.names import ResourceNames
from gpupool.extender import request_memo
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.request_memo import RequestMemo
from gpupool.extender.service import ExtenderService
from gpupool.kube.translate import TranslationError, pod_request
from tests.extender.binder_world import world
from tests.kube.builders import container, node, pod

NAMES = ResourceNames()


def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the pods the memo translates from here on."""
    translated: list[str] = []

    def counting(raw: dict[str, Any], names: ResourceNames) -> Any:
        translated.append(raw["metadata"]["name"])
        return pod_request(raw, names)

    monkeypatch.setattr(request_memo, "pod_request", counting)
    return translated


def _bound(p: dict[str, Any]) -> None:
    """What the bind and the node agent change: node, status, gpupool's own annotations."""
    p["spec"]["nodeName"] = "n1"
    p["status"] = {"phase": "Running"}
    p["metadata"]["resourceVersion"] = "2"
    p["metadata"]["annotations"][NAMES.assignment] = "{}"
    p["metadata"]["annotations"][NAMES.allocated] = "{}"


def _memory(p: dict[str, Any]) -> None:
    p["spec"]["containers"][0]["resources"]["limits"]["gpupool.io/gpu-mem"] = "8"


def _option(p: dict[str, Any]) -> None:
    p["metadata"]["annotations"][NAMES.exclusive] = "true"


def _priority_type(p: dict[str, Any]) -> None:
    p["spec"]["priority"] = False


def _init(p: dict[str, Any]) -> None:
    p["spec"]["initContainers"] = [container("init", gpu_mem=4)]


@pytest.mark.parametrize(("change", "again"), [
    pytest.param(_bound, False, id="bound-and-assigned-reuses"),
    pytest.param(_memory, True, id="container-resources-translate-again"),
    pytest.param(_option, True, id="option-annotation-translates-again"),
    pytest.param(_priority_type, True, id="boolean-priority-is-not-zero"),
    pytest.param(_init, True, id="init-container-translates-again"),
])
def test_a_later_object_of_the_pod_reuses_the_request_only_when_the_read_fields_are_equal(
        monkeypatch: pytest.MonkeyPatch, change: Callable[[dict[str, Any]], None], again: bool) -> None:
    translated = counted(monkeypatch)
    memo = RequestMemo(NAMES)
    first = pod("p", container(gpu_mem=4))
    first["spec"]["priority"] = 0
    later = copy.deepcopy(first)
    change(later)
    assert memo.request(first) == pod_request(first, NAMES)
    try:
        expected: Any = pod_request(later, NAMES)
    except TranslationError as exc:
        expected = type(exc)
    try:
        got: Any = memo.request(later)
    except TranslationError as exc:
        got = type(exc)
    assert got == expected
    assert translated == ["p", "p"] if again else translated == ["p"]


def test_pods_without_uid_and_refused_pods_are_translated_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    translated = counted(monkeypatch)
    memo = RequestMemo(NAMES)
    anonymous = pod("a", container(gpu_mem=4))
    anonymous["metadata"]["uid"] = ""
    refused = pod("r", container(gpu_mem=4, gpu="1"))  # whole cards and a slice at once
    for _ in range(2):
        memo.request(anonymous)
        with pytest.raises(TranslationError):
            memo.request(refused)
    assert translated == ["a", "r", "a", "r"]


def test_the_oldest_pod_is_dropped_past_the_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    translated = counted(monkeypatch)
    memo = RequestMemo(NAMES, capacity=2)
    pods = [pod(f"p{i}", container(gpu_mem=4)) for i in range(3)]
    for p in pods:
        memo.request(p)
    memo.request(pods[2])
    memo.request(pods[0])
    assert translated == ["p0", "p1", "p2", "p0"]


def test_the_watch_and_the_filter_share_the_caches_memo() -> None:
    """The pod's ADDED event translates it; the filter's copy and the bound object reuse that."""
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("n1", [16384])])
    cache.replace_pods([])
    added = pod("p", container(gpu_mem=4))
    cache.upsert_pod(copy.deepcopy(added))
    api = ExtenderApi(ExtenderService(cache, None), NAMES, ExtenderMetrics(), requests=cache.requests)
    assert api._pod_request(copy.deepcopy(added)) == pod_request(added, NAMES)
    bound = copy.deepcopy(added)
    _bound(bound)
    cache.upsert_pod(bound)
    assert cache.requests.hits == 2


def test_the_bind_reuses_the_request_its_watch_event_translated() -> None:
    api, cache, binder = world([node("n1", [16384])])
    api.create_pod(pod("p", container(gpu_mem=4)))  # the fake API's watch delivers it to the cache
    api.listeners.clear()  # from here on only the bind asks the memo
    hits = cache.requests.hits
    assert binder.bind("default", "p", "uid-default-p", "n1").ok
    assert cache.requests.hits == hits + 1
