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


def two_card_pod(name: str = "pair", cards: int = 2) -> dict[str, Any]:
    limits: dict[str, str | int] = {"gpupool.io/gpu-shared": cards, "gpu_mem": 16, "cpu": "1"}
    return pod(name, container("main", **limits),
               annotations={"gpupool.io/remote-gpu": "true"})


def two_card_cluster() -> list[dict[str, Any]]:
    """``far`` (other switch) has two cards; behind the pod's switch ``one`` has one, ``two`` two."""
    return [on_switch(node("far", [16276, 16276]), "s2"), on_switch(node("one", [16276]), "s1"),
            on_switch(node("two", [16276, 16276]), "s1"), on_switch(node("cpu"), "s1")]


def test_a_slice_on_two_cards_is_booked_on_two_cards_of_one_node_behind_the_switch_and_read_back() -> None:
    api, cache, binder = world(two_card_cluster())
    created = api.create_pod(two_card_pod())
    assert binder.bind("default", "pair", created["metadata"]["uid"], "cpu").ok
    share = decode_remote_share(api.get_pod("default", "pair")["metadata"]["annotations"][REMOTE_SHARE])
    assert share.server == "two" and sorted(c.index for c in share.cards) == [0, 1]
    assert {c.memory_mib for c in share.cards} == {4096}
    assert free_mib(cache, "two") == [12180, 12180] and free_mib(cache, "one") == [16276]
    _, restarted, _ = world(two_card_cluster())  # an extender started afresh books it from the annotation
    restarted.replace_pods(api.list_pods())
    assert free_mib(restarted, "two") == [12180, 12180]
    api.delete_pod("default", "pair")
    assert free_mib(cache, "two") == [16276, 16276]


def test_a_share_of_more_cards_than_any_one_node_has_is_refused_with_the_reason() -> None:
    api, cache, binder = world(two_card_cluster())
    service = ExtenderService(cache, binder, settings=ExtenderSettings(filter_best_only=False))
    three = service.filter(pod_request(two_card_pod("three", cards=3), cache.names), ["far", "one", "two", "cpu"])
    assert three.passed == []
    assert three.failed["cpu"] == "container main asks for 3 cards; the largest node has 2"
    for name in ("far", "two"):  # a card on each node taken: two free cards exist, never on one node
        api.create_pod(pod(f"fill-{name}", container(mib=16276, cpu="1")))
        assert binder.bind("default", f"fill-{name}", f"uid-default-fill-{name}", name).ok
    created = api.create_pod(two_card_pod())
    result = binder.bind("default", "pair", created["metadata"]["uid"], "cpu")
    assert not result.ok and "no GPU node of the cluster has 2 cards" in str(result)
