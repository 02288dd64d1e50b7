"""A remote-share pod through the extender: filter passes nodes without GPUs while some GPU node
can hold the share, the bind books it on that node's card and records it in the Binding
(``remote-share-v1``), and the booking ends with the pod or its server node."""

from __future__ import annotations

from typing import Any

from gpupool.api.remote_share import decode_remote_share
from gpupool.core.remote_share import SWITCH_LABEL
from gpupool.extender.service import ExtenderService, ExtenderSettings
from gpupool.kube.translate import pod_request
from tests.extender.binder_world import ASSIGNMENT, free_mib, world
from tests.kube.builders import container, node, pod

REMOTE_SHARE = "gpupool.io/remote-share-v1"


def on_switch(raw: dict[str, Any], switch: str) -> dict[str, Any]:
    raw["metadata"]["labels"][SWITCH_LABEL] = switch
    return raw


def cluster() -> list[dict[str, Any]]:
    """``far`` (other switch, tighter card) is listed first: only the switch puts ``near`` first."""
    return [on_switch(node("far", [8000]), "s2"), on_switch(node("near", [16276]), "s1"),
            on_switch(node("cpu"), "s1")]


def remote_pod(name: str = "p", mib: int = 4000) -> dict[str, Any]:
    return pod(name, container(mib=mib, cpu="1"), annotations={"gpupool.io/remote-gpu": "true"})


def test_the_bind_books_the_share_behind_the_pods_switch_and_writes_it_with_the_binding() -> None:
    api, cache, binder = world(cluster())
    created = api.create_pod(remote_pod())
    result = binder.bind("default", "p", created["metadata"]["uid"], "cpu")
    assert result.ok, result
    bound = api.get_pod("default", "p")
    assert bound["spec"]["nodeName"] == "cpu"
    notes = bound["metadata"]["annotations"]
    assert ASSIGNMENT not in notes  # nothing for the device plugin of the pod's node
    share = decode_remote_share(notes[REMOTE_SHARE])
    assert (share.server, share.card.index, share.card.memory_mib, share.pod_uid) == (
        "near", 0, 4000, created["metadata"]["uid"])
    assert free_mib(cache, "near") == [12276] and free_mib(cache, "far") == [8000]
    assert cache.state.placements["default/p"].cpu_milli == 0  # the CPU side is the pod's own node's


def test_the_booking_is_released_with_the_pod() -> None:
    api, cache, binder = world(cluster())
    created = api.create_pod(remote_pod())
    assert binder.bind("default", "p", created["metadata"]["uid"], "cpu").ok
    api.set_pod_phase("default", "p", "Running")
    assert free_mib(cache, "near") == [12276]  # the watch's copy keeps it booked
    api.delete_pod("default", "p")
    assert free_mib(cache, "near") == [16276]


def test_a_server_node_that_leaves_ends_the_booking() -> None:
    api, cache, binder = world(cluster())
    created = api.create_pod(remote_pod())
    assert binder.bind("default", "p", created["metadata"]["uid"], "cpu").ok
    cache.remove_node("near")
    assert "default/p" not in cache.state.placements


def test_a_gpu_node_binds_the_pod_with_a_plain_local_assignment() -> None:
    api, cache, binder = world(cluster())
    created = api.create_pod(remote_pod())
    assert binder.bind("default", "p", created["metadata"]["uid"], "near").ok
    notes = api.get_pod("default", "p")["metadata"]["annotations"]
    assert ASSIGNMENT in notes and REMOTE_SHARE not in notes
    assert cache.state.placements["default/p"].cpu_milli == 1000


def test_filter_passes_nodes_without_gpus_only_while_some_gpu_node_holds_the_share() -> None:
    api, cache, binder = world(cluster())
    service = ExtenderService(cache, binder, settings=ExtenderSettings(filter_best_only=False))
    names = ["far", "near", "cpu"]
    fits = service.filter(pod_request(remote_pod(), cache.names), names)
    assert fits.passed == names, fits.failed
    too_big = service.filter(pod_request(remote_pod("big", mib=20000), cache.names), names)
    assert too_big.passed == [] and "the largest card has 16276 MiB" in too_big.failed["cpu"]
    api.create_pod(remote_pod("filler", mib=16276))
    assert binder.bind("default", "filler", "uid-default-filler", "near").ok
    rest = service.filter(pod_request(remote_pod("late", mib=9000), cache.names), names)
    assert rest.passed == [], rest.failed
    assert rest.failed["cpu"] == "no GPU node of the cluster has a card that can hold the remote share now"
    assert "runs a remote-share pod only on its own cards" in rest.failed["far"]


def test_the_best_node_is_one_with_a_local_card() -> None:
    """The seed's matching rule: prefer workers with local GPUs (then a node behind their switch)."""
    _, cache, binder = world(cluster())
    service = ExtenderService(cache, binder, settings=ExtenderSettings(filter_one_best=False))
    best = service.filter(pod_request(remote_pod(), cache.names), ["far", "near", "cpu"])
    assert best.passed == ["far", "near"]


def test_a_node_without_cards_that_takes_no_shares_still_runs_a_remote_client() -> None:
    """Its agent's "whole GPUs only" notice is about its own cards; the share is enforced by the
    server. A GPU node that takes no shares stays refused (it would get a local share)."""
    from gpupool.api.enforcement import EnforcementNotice, encode_notice

    whole_only = {"gpupool.io/enforcement-v1": encode_notice(EnforcementNotice("none", False, False, "no backend"))}
    nodes = cluster()
    for raw in nodes:
        if raw["metadata"]["name"] in ("cpu", "far"):
            raw["metadata"]["annotations"].update(whole_only)
    _, cache, binder = world(nodes)
    service = ExtenderService(cache, binder, settings=ExtenderSettings(filter_best_only=False))
    found = service.filter(pod_request(remote_pod(), cache.names), ["far", "near", "cpu"])
    assert found.passed == ["near", "cpu"]
    assert "takes whole GPUs only" in found.failed["far"]


def test_a_remote_share_pod_preempts_nobody() -> None:
    """Evicting pods of the node it would run on frees no card of the server it needs."""
    api, cache, binder = world(cluster())
    api.create_pod(pod("low", container(mib=16276, cpu="1"), node_name="near"))
    service = ExtenderService(cache, binder)
    request = pod_request(remote_pod(mib=16000), cache.names)
    assert service.preempt(request, {"cpu": [], "near": ["uid-default-low"]}) == ({}, "")
