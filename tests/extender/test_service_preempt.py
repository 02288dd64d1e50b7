"""Preempt asks a what-if copy of the nodes: the shared ledger is only read, never lifted and
re-booked, and victims of any kind (GPU slices, CPU hogs, an unreadable claim) count."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpupool.core.state import ClusterState
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import ExtenderService
from gpupool.kube.translate import pod_request
from tests.kube.builders import container, node, placed_pod, pod

CARD = 16276
ARRAYS = ("node_version", "cpu_free", "mem_free", "card_mem_free", "card_compute_free", "card_mode")


def cluster() -> ClusterCache:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("N1", [CARD, CARD]), node("N2", [CARD]), node("N3", [CARD])])
    hog = pod("hog", container(cpu="31"), node_name="N3")  # a pod without GPUs filling N3's CPU
    broken = pod("broken", container(mib=1000), node_name="N2", annotations={"gpupool.io/assignment-v1": "{"})
    cache.replace_pods([placed_pod("n1a", "N1", 0, CARD), placed_pod("n1b", "N1", 1, 12000), hog, broken])
    return cache


def untouchable(state: ClusterState, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any booking change on the shared ledger fails the test."""
    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("preempt changed the shared ledger")

    for method in ("apply", "release", "claim", "upsert_node", "remove_node"):
        monkeypatch.setattr(state, method, refuse)


def test_preempt_reads_the_shared_ledger_only(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = cluster()
    service = ExtenderService(cache, None)
    state = cache.state
    versions, placements = (state.version, state.layout_version), dict(state.placements)
    arrays = {name: getattr(state, name).copy() for name in ARRAYS}
    untouchable(state, monkeypatch)
    request = pod_request(pod("p", container(mib=CARD, cpu="2")), cache.names)
    kept, error = service.preempt(request, {"N1": ["uid-default-n1b"], "N3": ["uid-default-hog"]})
    assert error == "" and kept == {"N1": ["uid-default-n1b"], "N3": ["uid-default-hog"]}
    assert (state.version, state.layout_version) == versions and state.placements == placements
    assert all(np.array_equal(getattr(state, name), arrays[name]) for name in ARRAYS)


@pytest.mark.parametrize(("victims", "kept"), [
    pytest.param({"N1": []}, set(), id="nothing-evicted-nothing-freed"),
    pytest.param({"N1": ["uid-default-n1a"]}, {"N1"}, id="a-whole-card-freed"),
    pytest.param({"N3": []}, set(), id="gpu-free-but-cpu-full"),
    pytest.param({"N3": ["uid-default-hog"]}, {"N3"}, id="a-pod-without-gpus-frees-the-cpu"),
    pytest.param({"N2": []}, set(), id="an-unreadable-claim-keeps-its-node-closed"),
    pytest.param({"N2": ["uid-default-broken"]}, {"N2"}, id="unless-its-pod-is-a-victim"),
    pytest.param({"N1": ["uid-default-hog"]}, set(), id="a-victim-on-another-node-frees-nothing-here"),
    pytest.param({"gone": []}, set(), id="an-unknown-node"),
])
def test_preempt_keeps_the_nodes_where_the_victims_free_enough(victims: dict[str, list[str]],
                                                               kept: set[str]) -> None:
    cache = cluster()
    service = ExtenderService(cache, None)
    request = pod_request(pod("p", container(mib=CARD, cpu="2")), cache.names)
    answer, error = service.preempt(request, victims)
    assert error == "" and set(answer) == kept
    assert all(answer[n] == victims[n] for n in kept)


def test_preempt_never_answers_a_node_with_no_victims() -> None:
    """kube-scheduler before kubernetes#101560 (pickOneNodeForPreemption) reads the first victim
    of every candidate when several tie, and an empty list crashes it; a node where the pod fits
    with nobody evicted (freed since the filter) is left out, and the pod's next cycle takes it."""
    cache = cluster()
    service = ExtenderService(cache, None)
    request = pod_request(pod("p", container(mib=4000, cpu="2")), cache.names)  # fits card 1 of N1 now
    answer, error = service.preempt(request, {"N1": [], "N3": ["uid-default-hog"]})
    assert error == "" and answer == {"N3": ["uid-default-hog"]}
