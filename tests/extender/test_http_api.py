"""The HTTP endpoints through aiohttp's test client: exact wire JSON, both node modes, bad input."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.utils import floatToGoString

from gpupool.api.annotations import decode_assignment
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.wire import HostPriorityEncoder, host_priority_list
from gpupool.extender.service import UNKNOWN_NODE, scale_scores
from gpupool.testing.fake_api import FakePodApi
from tests.extender.http_world import ALIBABA_NODES, args, post, run
from tests.extender.modes import EVERY_FIT
from tests.kube.builders import container, node, placed_pod, pod


def test_filter_node_names_mode_alibaba_example() -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        status, body = await post(client, "/filter", args(pod("p", container(mib=8138))))
        assert status == 200
        assert body["NodeNames"] == ["N3"]
        assert body["Nodes"] is None and body["Error"] == ""
        assert body["FailedNodes"] == {
            "N1": "no single card has 8138 MiB free; largest free 4069 MiB",
            "N2": "no single card has 8138 MiB free; largest free 4069 MiB",
        }

    run(scenario, settings=EVERY_FIT)


def test_filter_full_nodes_mode_returns_node_objects() -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        status, body = await post(client, "/filter", args(pod("p", container(mib=8138)), full=True))
        assert status == 200
        assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["N3"]
        assert body["NodeNames"] is None
        assert set(body["FailedNodes"]) == {"N1", "N2"}

    run(scenario, settings=EVERY_FIT)


def test_field_names_are_read_case_insensitively() -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        status, body = await post(
            client, "/filter", {"pod": pod("p", container(mib=8138)), "nodenames": ["N3", "N9"]}
        )
        assert status == 200 and body["NodeNames"] == ["N3"]
        assert body["FailedNodes"] == {"N9": "node is not in the gpupool extender's cache"}

    run(scenario, settings=EVERY_FIT)


def test_prioritize_scores_zero_to_ten() -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        status, body = await post(client, "/prioritize", args(pod("p", container(mib=1000))))
        assert status == 200
        scores = {e["Host"]: e["Score"] for e in body}
        assert set(scores) == {"N1", "N2", "N3"}
        assert all(0 <= s <= 10 and isinstance(s, int) for s in scores.values())
        assert max(scores.values()) == 10
        # binpack: the tightest card that still fits is N1 GPU1 (4,069 free), so N1 is best.
        assert scores["N1"] == 10
        status, body = await post(client, "/prioritize", args(pod("p", container(mib=8138))))
        assert {e["Host"]: e["Score"] for e in body} == {"N1": 0, "N2": 0, "N3": 10}

    run(scenario)


def test_prioritize_reuses_the_same_pods_filter_scores_while_the_ledger_is_unchanged() -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        calls: list[int] = []
        scheduler = cache.scheduler
        original = scheduler.filter_and_score

        def counting(*a: Any, **k: Any) -> Any:
            calls.append(1)
            return original(*a, **k)

        scheduler.filter_and_score = counting  # type: ignore[method-assign]
        p = pod("p", container(mib=1000))
        _, filtered = await post(client, "/filter", args(p))
        assert filtered["NodeNames"] == ["N1", "N2", "N3"] and len(calls) == 1
        _, reused = await post(client, "/prioritize", args(p, filtered["NodeNames"]))
        assert len(calls) == 1  # answered from the filter's scores
        # a different pod, or a node list other than the filter's, is scored afresh: same answer
        _, fresh = await post(client, "/prioritize", args(pod("q", container(mib=1000)), ["N1", "N2", "N3"]))
        assert len(calls) == 2 and fresh == reused
        assert {e["Host"]: e["Score"] for e in reused}["N1"] == 10

    run(scenario, settings=EVERY_FIT)


def test_prioritize_after_a_booking_between_filter_and_prioritize_scores_afresh() -> None:
    """A bind landing between a pod's filter and prioritize changes the ledger: the filter's scores
    are stale (N1, the binpack favourite, is now full) and must not be reused."""
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        p = pod("p", container(mib=1000))
        _, filtered = await post(client, "/filter", args(p))
        assert filtered["NodeNames"] == ["N1", "N2", "N3"]
        cache.upsert_pod(placed_pod("late", "N1", 1, 4069))
        _, body = await post(client, "/prioritize", args(p, filtered["NodeNames"]))
        scores = {e["Host"]: e["Score"] for e in body}
        assert scores["N1"] == 0 and max(scores.values()) == 10

    run(scenario, settings=EVERY_FIT)


def test_any_node_name_comes_back_as_valid_json() -> None:
    """Names are echoed in FailedNodes and HostPriorityList; whatever a client sends (quotes,
    backslashes, a trailing newline, non-ASCII), the answer must stay valid JSON with the same name."""
    odd = ['a"b', "c\\d", "e\n", "ünï", "N1"]

    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        status, body = await post(client, "/filter", args(pod("p", container(mib=1000)), odd))
        assert status == 200
        assert body["NodeNames"] == ["N1"]
        assert set(body["FailedNodes"]) == set(odd[:-1])
        status, body = await post(client, "/prioritize", args(pod("p", container(mib=1000)), odd))
        assert status == 200
        assert [e["Host"] for e in body] == odd
        assert {e["Host"]: e["Score"] for e in body}["N1"] == 10

    run(scenario, settings=EVERY_FIT)


def test_a_node_leaving_while_another_returns_is_seen_by_the_next_filter() -> None:
    """The same name list is mapped to ledger rows once and reused; the reuse must end when the set
    of nodes changes, even if the number of nodes present stays the same."""
    names = ["N1", "N2", "N3"]

    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        cache.remove_node("N3")
        _, body = await post(client, "/filter", args(pod("p", container(mib=1000)), names))
        assert body["FailedNodes"]["N3"] == UNKNOWN_NODE
        cache.remove_node("N2")
        cache.upsert_node(node("N3", [16276, 16276]))
        _, body = await post(client, "/filter", args(pod("p", container(mib=1000)), names))
        assert body["FailedNodes"] == {"N2": UNKNOWN_NODE}
        assert body["NodeNames"] == ["N1", "N3"]

    run(scenario, settings=EVERY_FIT, pods=[])


def test_host_priority_encoder_writes_the_same_json_as_the_plain_list() -> None:
    encoder = HostPriorityEncoder(max_hosts=4)
    scores: dict[str, Any] = {"N1": 10, 'a"b': 0, "c\\d": 3, "e\n": True, "ünï": np.int64(7), "big": 12}
    for _ in range(2):  # the second time from remembered fragments (emptied once past max_hosts)
        body = encoder.encode(scores)
        assert json.loads(body) == host_priority_list(scores)
        assert all(type(e["Score"]) is int for e in json.loads(body))
    assert encoder.encode({}) == b"[]"


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=12), st.integers(-3, 13)), max_size=30),
       st.integers(1, 40))
def test_host_priority_encoder_lists_match_the_plain_list(pairs: list[tuple[str, int]], memo: int) -> None:
    """Aligned host and score sequences (the service's numpy scores) give the same JSON as the plain
    list, whether the scores are in 0..10 (the interleaved fast path) or not, with a memo that
    overflows and is refilled."""
    encoder = HostPriorityEncoder(max_hosts=memo)
    hosts = [h for h, _ in pairs]
    scores = [v for _, v in pairs]
    expected = [{"Host": h, "Score": v} for h, v in pairs]
    for _ in range(2):
        assert json.loads(encoder.encode_lists(hosts, np.array(scores, dtype=np.int64))) == expected
        assert json.loads(encoder.encode_lists(hosts, scores)) == expected


def test_scale_scores_keeps_the_asked_order_and_zeroes_infeasible_nodes() -> None:
    names = ["a", "b", "c", "d"]
    scaled = scale_scores(["b", "d"], np.array([1.0, 3.0]), names)
    assert scaled.hosts == names
    assert scaled.as_dict() == {"a": 0, "b": 0, "c": 0, "d": 10}
    assert scale_scores(["d", "b"], np.array([2.0, 2.0]), names).as_dict() == {"a": 0, "b": 10, "c": 0, "d": 10}
    every = scale_scores(names, np.array([0.0, 5.0, 10.0, 2.5]), names)
    assert every.scores.tolist() == [0, 5, 10, 2]  # rint: 2.5 rounds to even
    assert scale_scores([], np.zeros(0), names).as_dict() == dict.fromkeys(names, 0)


def test_bind_lands_on_n3_gpu0_and_records_it() -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        api.create_pod(pod("p", container(mib=8138)))
        body = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-default-p", "Node": "N3"}
        status, result = await post(client, "/bind", body)
        assert (status, result) == (200, {"Error": ""})
        stored = api.get_pod("default", "p")
        assignment = json.loads(stored["metadata"]["annotations"]["gpupool.io/assignment-v1"])
        assert stored["spec"]["nodeName"] == "N3"
        assert assignment["containers"][0]["cards"] == [
            {"index": 0, "uuid": "GPU-N3-0", "memoryMiB": 8138, "computeMilli": 0, "exclusive": False}
        ]
        status, again = await post(client, "/bind", {**body, "PodName": "q"})
        assert status == 200 and "no longer exists" in again["Error"]

    run(scenario)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ask", "taken"),
    [({"mib": 8138}, {"mib": 8138}), ({"gpu_core": 50}, {"gpu_core": 50}), ({"gpu": 1}, None)],
    ids=["last-half-memory", "last-half-compute", "last-whole-card"],
)
def test_concurrent_binds_for_the_last_space_on_a_card_never_both_succeed(
    ask: dict[str, int], taken: dict[str, int] | None
) -> None:
    """Eight binds for the one space left on a card arrive at once and run side by side on the
    extender's bind threads, each API call taking 20 ms: every round exactly one wins, the others
    get the core's reason, and the recorded assignments never over-commit the card."""

    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        for round_ in range(3):
            name = f"card{round_}"
            cache.upsert_node(node(name, [16276]))
            if taken is not None:
                first = api.create_pod(pod(f"first{round_}", container(**taken)))
                status, body = await post(client, "/bind", binding(first, name))
                assert (status, body) == (200, {"Error": ""})
            contenders = [api.create_pod(pod(f"r{round_}c{i}", container(**ask))) for i in range(8)]
            answers = await asyncio.gather(*(post(client, "/bind", binding(p, name)) for p in contenders))
            assert all(status == 200 for status, _ in answers)
            errors = [body["Error"] for _, body in answers]
            assert errors.count("") == 1, errors
            assert all("does not fit" in e for e in errors if e)
        memory: dict[tuple[str, int], int] = defaultdict(int)
        compute: dict[tuple[str, int], int] = defaultdict(int)
        holders: dict[tuple[str, int], list[bool]] = defaultdict(list)
        for p in api.list_pods():
            text = p["metadata"]["annotations"].get("gpupool.io/assignment-v1")
            if text and p["spec"].get("nodeName"):
                assignment = decode_assignment(text)
                for ref in assignment.containers[0].cards:
                    memory[(assignment.node, ref.index)] += ref.memory_mib
                    compute[(assignment.node, ref.index)] += 1000 if ref.exclusive else ref.compute
                    holders[(assignment.node, ref.index)].append(ref.exclusive)
        assert len(holders) == 3
        assert all(v <= 16276 for v in memory.values()), memory
        assert all(v <= 1000 for v in compute.values()), compute
        assert all(len(h) == 1 for h in holders.values() if any(h)), holders
        for round_ in range(3):
            assert [u.memory_free for u in cache.state.card_usage(f"card{round_}")] == [
                16276 - memory[(f"card{round_}", 0)]
            ]

    run(scenario, pods=[], latency=0.02)


def binding(p: dict[str, Any], node_name: str) -> dict[str, str]:
    meta = p["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node_name}


def test_bind_on_a_follower_is_refused() -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        api.create_pod(pod("p", container(mib=1)))
        status, result = await post(
            client, "/bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "", "Node": "N3"}
        )
        assert status == 200
        assert result["Error"] == "this gpupool extender replica is not the leader; the leader is replica-0"

    run(scenario, leader=False)


def test_only_the_leader_is_ready() -> None:
    """kube-scheduler reaches the extender through a Service whose Ready endpoints are the replicas
    whose /readyz answers 200: a follower must not be one, or its binds refuse "not the leader"."""
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        resp = await client.get("/readyz")
        assert resp.status == 503
        assert await resp.text() == "not the leader; the leader is replica-0"

    async def leading(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        resp = await client.get("/readyz")
        assert resp.status == 200

    run(scenario, leader=False)
    run(leading)


def test_every_synced_replica_is_ready_by_syncz() -> None:
    """The Deployment's readiness: a follower whose cache synced is Ready (so a rolling update can
    bring it up while the old leader leads); kube-scheduler's Service picks the leader by its label."""
    async def follower(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        resp = await client.get("/syncz")
        assert resp.status == 200 and (await client.get("/readyz")).status == 503

    async def unsynced(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        resp = await client.get("/syncz")
        assert resp.status == 503 and await resp.text() == "cache not synced"

    run(follower, leader=False)
    run(unsynced, synced=False)


def test_not_synced_answers_an_error_instead_of_guessing() -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        status, body = await post(client, "/filter", args(pod("p", container(mib=1))))
        assert status == 200 and "not synced" in body["Error"] and body["NodeNames"] == []
        resp = await client.get("/readyz")
        assert resp.status == 503
        status, body = await post(client, "/filter", args(pod("plain", container(cpu="1"))))
        assert body["NodeNames"] == ["N1", "N2", "N3"] and body["Error"] == ""

    run(scenario, synced=False)


def test_malformed_input_gets_400_with_an_error() -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        cases: list[tuple[str, Any, str]] = [
            ("/filter", "{not json", "malformed JSON"),
            ("/filter", b"\xff\xfe", "malformed JSON"),
            ("/filter", [], "expected a JSON object"),
            ("/filter", {"NodeNames": ["N1"]}, "missing field Pod"),
            ("/filter", {"Pod": {"metadata": {}}, "NodeNames": ["N1"]}, "missing metadata.name"),
            ("/filter", {"Pod": pod("p"), "NodeNames": "N1"}, "list of node names"),
            ("/filter", {"Pod": pod("p"), "NodeNames": ["N1", 2]}, "list of node names"),
            ("/prioritize", {"Pod": pod("p"), "NodeNames": [None]}, "list of node names"),
            ("/filter", b'{"Pod": 1, "Pod": NaN}', "malformed JSON"),
            ("/filter", {"Pod": pod("p")}, "needs Nodes or NodeNames"),
            (
                "/prioritize",
                {"Pod": pod("p"), "Nodes": {"items": [{"metadata": {}}]}},
                "missing metadata.name",
            ),
            ("/bind", {"PodName": "p", "PodNamespace": "default"}, "missing or empty field Node"),
            ("/bind", {"PodName": 3, "PodNamespace": "default", "Node": "N1"}, "PodName"),
            ("/preempt", {"Pod": pod("p"), "NodeNameToMetaVictims": {"N1": {"Pods": [{}]}}}, "missing uid"),
        ]
        for path, body, fragment in cases:
            status, result = await post(client, path, body)
            assert status == 400, (path, body)
            assert fragment in result["Error"], (fragment, result)

    run(scenario)


def test_broken_pod_annotations_are_an_error_not_a_crash() -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        bad = pod("p", container(mib=10), annotations={"gpupool.io/exclusive": "maybe"})
        status, body = await post(client, "/filter", args(bad))
        assert status == 200 and "gpupool.io/exclusive" in body["Error"]
        status, body = await post(client, "/prioritize", args(bad))
        assert status == 200 and {e["Score"] for e in body} == {0}
        status, body = await post(client, "/filter", args(pod("p", container(mib="12.5"))))
        assert "whole number" in body["Error"]
        status, body = await post(client, "/filter", args(pod("p", container(mib=100000))))
        assert body["NodeNames"] == [] and set(body["FailedNodes"]) == {"N1", "N2", "N3"}
        assert "largest card has 16276 MiB" in body["FailedNodes"]["N1"]

    run(scenario)


def test_gpu_mem_in_the_wrong_unit_is_refused_with_the_unit_and_what_to_write() -> None:
    """``gpu-mem: 4Gi`` reaches the extender as 4294967296 units of 256 MiB (1 EiB): the pod's event
    says so and what to write, not that no node has room."""
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        for value, count, size in (("4Gi", 4294967296, "1 EiB"), ("4096", 4096, "1 TiB")):
            status, body = await post(client, "/filter", args(pod("p", container(gpu_mem=value))))
            assert status == 200 and body["NodeNames"] == []
            assert body["Error"] == (f"pod default/p container main: gpupool.io/gpu-mem counts 256 MiB units: "
                                     f"{count} is {size}; for 4 GiB write 16")

    run(scenario)


def test_preempt_keeps_only_nodes_where_the_victims_free_enough() -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        body = {
            "Pod": pod("p", container(mib=16276)),
            "NodeNameToMetaVictims": {
                "N1": {"Pods": [{"UID": "uid-default-n1b"}], "NumPDBViolations": 1},  # frees GPU1
                "N2": {"Pods": [{"UID": "uid-default-n2a"}], "NumPDBViolations": 0},  # frees GPU0
                "N3": {"Pods": [], "NumPDBViolations": 0},  # frees nothing
            },
        }
        before = [u.memory_free for n in ("N1", "N2", "N3") for u in cache.state.card_usage(n)]
        status, result = await post(client, "/preempt", body)
        assert status == 200
        assert result == {
            "NodeNameToMetaVictims": {
                "N1": {"Pods": [{"UID": "uid-default-n1b"}], "NumPDBViolations": 1},
                "N2": {"Pods": [{"UID": "uid-default-n2a"}], "NumPDBViolations": 0},
            }
        }
        after = [u.memory_free for n in ("N1", "N2", "N3") for u in cache.state.card_usage(n)]
        assert before == after

    run(scenario)


def test_metrics_count_requests_and_export_cluster_totals() -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        await post(client, "/filter", args(pod("p", container(mib=1))))
        await post(client, "/filter", "{")
        text = await (await client.get("/metrics")).text()
        assert 'gpupool_extender_requests_total{outcome="ok",verb="filter"} 1.0' in text
        assert 'gpupool_extender_requests_total{outcome="bad_request",verb="filter"} 1.0' in text
        assert "gpupool_extender_request_seconds_bucket" in text
        booked = 16276 + 12207 + 12207 + 12207 + 8138 + 16276  # ALIBABA_PODS; per-card series: node agents
        booked += 1  # p, passed one node: its filter assumed 1 MiB there until its bind
        assert f"gpupool_cluster_gpu_memory_allocated_bytes {floatToGoString(booked << 20)}" in text  # bytes
        assert "gpupool_extender_assumed_pods 1.0" in text
        assert "gpupool_extender_cache_synced 1.0" in text

    run(scenario)


def test_broken_node_inventory_is_the_failure_reason() -> None:
    bad = node("N4", annotations={"gpupool.io/inventory-v1": '{"v": 1, "cards": 3}'})

    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        _status, body = await post(client, "/filter", args(pod("p", container(mib=1)), ["N3", "N4"]))
        assert body["NodeNames"] == ["N3"]
        assert "cards: expected list" in body["FailedNodes"]["N4"]

    run(scenario, settings=EVERY_FIT, nodes=[*ALIBABA_NODES, bad])


def test_foreign_aliases_go_only_to_nodes_that_serve_them() -> None:
    """kubelet drops an extended resource its node does not advertise (no Allocate, no grant), so a
    pod asking for an alias passes only the nodes whose kubelet lists it; the others are refused
    with the node agent flag that would serve it. HAMi's memory rides on nvidia.com/gpu: without it in
    the container no node can hand the grant, and every node says so."""
    nodes = [node("serves", [16384], serves=("aliyun.com/gpu-mem", "tencent.com/vcuda-core", "nvidia.com/gpu")),
             node("plain", [16384], serves=())]

    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        names = ["serves", "plain"]
        status, body = await post(client, "/filter", args(pod("p", container(**{"aliyun.com/gpu-mem": 4})), names))
        assert status == 200 and body["NodeNames"] == ["serves"]
        assert body["FailedNodes"] == {"plain": "node does not serve aliyun.com/gpu-mem: start its gpupool "
                                                "node agent with --serve-aliases gpushare"}
        status, body = await post(client, "/filter", args(pod("q", container(**{
            "tencent.com/vcuda-core": 20, "tencent.com/vcuda-memory": 8})), names))
        assert body["NodeNames"] == []
        assert "--serve-aliases gpumanager" in body["FailedNodes"]["serves"]
        assert "tencent.com/vcuda-core, tencent.com/vcuda-memory" in body["FailedNodes"]["plain"]
        status, body = await post(client, "/filter", args(pod("r", container(mib=1000)), names))
        assert body["NodeNames"] == [] and all("needs nvidia.com/gpu beside it" in r
                                               for r in body["FailedNodes"].values())
        hami = container(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 30})
        status, body = await post(client, "/filter", args(pod("r2", hami), names))
        assert body["NodeNames"] == ["serves"]
        assert body["FailedNodes"] == {"plain": "node does not serve nvidia.com/gpu: start its gpupool "
                                                "node agent with --hami"}
        status, body = await post(client, "/prioritize", args(pod("s", container(**{"aliyun.com/gpu-mem": 4})),
                                                               names))
        assert {h["Host"]: h["Score"] for h in body} == {"serves": 10, "plain": 0}
        # gpupool's own resources need no alias: both nodes qualify
        status, body = await post(client, "/filter", args(pod("t", container(gpu_mem=16)), names))
        assert body["NodeNames"] == names
        # The node agent of "plain" starts serving gpushare: the next filter sees it (no stale mask).
        cache.upsert_node(node("plain", [16384], serves=("aliyun.com/gpu-mem",)))
        status, body = await post(client, "/filter", args(pod("u", container(**{"aliyun.com/gpu-mem": 4})), names))
        assert body["NodeNames"] == names and body["FailedNodes"] == {}
        cache.upsert_node(node("serves", [16384], serves=()))
        status, body = await post(client, "/filter", args(pod("v", container(**{"aliyun.com/gpu-mem": 4})), names))
        assert body["NodeNames"] == ["plain"] and set(body["FailedNodes"]) == {"serves"}

    run(scenario, settings=EVERY_FIT, nodes=nodes, pods=[])
