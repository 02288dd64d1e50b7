"""``inspect``: the per-card views, the aligned table and the JSON, on hand-made API objects."""

from __future__ import annotations

import datetime as dt

import pytest

from gpupool.api.annotations import CardRef
from gpupool.api.remote_share import RemoteShare, encode_remote_share
from gpupool.kubectl.inspect import HEADERS, inspect_json, inspect_table, node_views
from gpupool.kubectl.snapshot import build_snapshot
from gpupool.kubectl.usage import CardUsageSample, NoUsage, RemoteClientLive
from tests.kubectl.objects import NAMES, NOW, assignment, gpu_node, gpu_pod, placed


class FixedUsage:
    """A usage source that reports one card of node a, and nothing of node b (its agent is away)."""

    def card_usage(self, node: str, uuid: str) -> CardUsageSample | None:
        return CardUsageSample(utilisation_pct=37.0, memory_used_mib=5120) if uuid == "GPU-a-0" else None

    def node_note(self, node: str) -> str | None:
        return "usage not read: 503 Service Unavailable" if node == "b" else None

    def remote_client(self, node: str, pod: str, uuid: str) -> RemoteClientLive | None:
        return None


def views(usage: object = None, only: str | None = None) -> list:  # type: ignore[type-arg]
    nodes = [gpu_node("b", [16384]), gpu_node("a", [16384, 16384])]
    pods = [placed("p1", "a", 0, 8), placed("p2", "a", 0, 4, namespace="ml", container="worker"),
            gpu_pod("w", 2, annotations=assignment("b", 0, 512, compute=250))]
    snapshot = build_snapshot(nodes, pods, NAMES, now=NOW.timestamp())
    return node_views(snapshot, usage or NoUsage(), only=only)  # type: ignore[arg-type]


def test_cards_show_booked_over_total_and_their_holders() -> None:
    card = views()[0].cards[0]
    assert (card.memory_booked, card.memory_total) == (3072, 16384)
    assert [h.shown() for h in card.holders] == ["ml/p2/worker (1024MiB, 0%)", "team/p1/main (2048MiB, 0%)"]


def test_the_table_aligns_columns_and_puts_further_holders_on_their_own_line() -> None:
    lines = inspect_table(views()).splitlines()
    assert lines[0].split() == list(HEADERS)
    start = lines[0].index("HOLDERS")
    assert lines[1][start:] == "ml/p2/worker (1024MiB, 0%)"
    assert lines[2].strip() == "team/p1/main (2048MiB, 0%)" and lines[2].index("team") == start
    assert lines[1].split()[:8] == ["a", "0", "Tesla-T4", "healthy", "shared", "3072/16384", "0%/100%", "-"]
    assert lines[3].split() == ["a", "1", "Tesla-T4", "healthy", "idle", "0/16384", "0%/100%", "-", "-"]


def test_a_bind_in_flight_is_marked() -> None:
    holder = views(only="b")[0].cards[0].holders[0]
    assert holder.shown() == "team/w/main (512MiB, 25%) binding"


def test_usage_is_a_dash_until_a_source_reports_it() -> None:
    assert views()[0].cards[0].usage is None
    row = inspect_table(views(FixedUsage())).splitlines()[1]
    assert "37% 5120MiB" in row
    assert inspect_json(views(FixedUsage()))["nodes"][0]["cards"][0]["usage"] == {
        "utilisationPercent": 37.0, "memoryUsedMiB": 5120}


def test_a_node_whose_usage_is_unknown_gets_a_note_below_the_table() -> None:
    text = inspect_table(views(FixedUsage()))
    assert text.splitlines()[-1] == "node b: usage not read: 503 Service Unavailable"
    doc = inspect_json(views(FixedUsage()))
    assert [(n["name"], n["usageNote"]) for n in doc["nodes"]] == [
        ("a", None), ("b", "usage not read: 503 Service Unavailable")]
    assert doc["nodes"][1]["cards"][0]["usage"] is None


def test_json_carries_the_same_numbers() -> None:
    doc = inspect_json(views(), {"team/x": "why"})
    card = doc["nodes"][0]["cards"][0]
    assert card["memoryMiB"] == {"booked": 3072, "total": 16384}
    assert card["computeMilli"] == {"booked": 0, "total": 1000}
    assert [h["pod"] for h in card["holders"]] == ["ml/p2", "team/p1"]
    assert doc["nodes"][0]["cpuMilli"] == {"booked": 2000, "total": 16000}
    assert doc["podProblems"] == {"team/x": "why"}


@pytest.mark.parametrize("only, names", [
    pytest.param(None, ["a", "b"], id="all-nodes-by-name"),
    pytest.param("b", ["b"], id="one-node"),
    pytest.param("nope", [], id="unknown-node"),
])
def test_node_filter(only: str | None, names: list[str]) -> None:
    assert [v.name for v in views(only=only)] == names


def test_a_node_without_cards_and_its_problem_are_shown() -> None:
    node = gpu_node("c", [16384])
    node["metadata"]["annotations"][NAMES.inventory] = "garbage"
    text = inspect_table(node_views(build_snapshot([node], [], NAMES, now=0), NoUsage()))
    assert text.splitlines()[1].split() == ["c", *["-"] * (len(HEADERS) - 1)]
    assert text.splitlines()[2].startswith("node c: node c: inventory-v1")


def test_over_committed_cards_say_so() -> None:
    pods = [placed("a", "n", 0, 40), placed("b", "n", 0, 40)]
    text = inspect_table(node_views(build_snapshot([gpu_node("n", [16384])], pods, NAMES, now=0), NoUsage()))
    assert "over-committed" in text.splitlines()[1]


def test_no_nodes() -> None:
    assert inspect_table([]) == "No nodes found."


def test_a_node_that_does_not_enforce_its_shares_says_so() -> None:
    from gpupool.api.enforcement import EnforcementNotice, encode_notice
    whole_only = gpu_node("a", [16384])
    whole_only["metadata"]["annotations"][NAMES.enforcement] = encode_notice(
        EnforcementNotice("none", False, False, "auto: no interception library"))
    enforcing = gpu_node("b", [16384])
    enforcing["metadata"]["annotations"][NAMES.enforcement] = encode_notice(EnforcementNotice("shim", True, True))
    snapshot = build_snapshot([whole_only, enforcing], [], NAMES, now=NOW.timestamp())
    shown = node_views(snapshot, NoUsage())
    table = inspect_table(shown)
    assert "node a: GPU shares: none: cannot enforce shares, whole cards only (auto: no interception library)" in table
    assert "node b:" not in table
    assert [n["enforcementNote"] for n in inspect_json(shown)["nodes"]][1] is None
    assert "whole GPUs only" in snapshot.share_refusals["a"] and "b" not in snapshot.share_refusals


def remote_pod(name: str, runs_on: str, server: str) -> dict[str, object]:
    """A pod running on ``runs_on`` that uses 4000 MiB of ``server``'s card 0 over the network
    (``remote-share-v1``, written by the extender's bind)."""
    share = encode_remote_share(RemoteShare(server=server, time=NOW, container="main", pod_uid=f"uid-{name}",
                                            card=CardRef(0, f"GPU-{server}-0", 4000, 250)))
    return gpu_pod(name, 16, node=runs_on, phase="Running",
                   annotations={NAMES.remote_gpu: "true", NAMES.remote_share: share})


def test_a_remote_share_shows_on_the_servers_card_with_the_node_it_runs_on() -> None:
    nodes = [gpu_node("gpu", [16384]), gpu_node("cpu", [])]
    snapshot = build_snapshot(nodes, [remote_pod("r", "cpu", "gpu"), remote_pod("q", "", "gpu")], NAMES,
                              now=NOW.timestamp())
    server = node_views(snapshot, NoUsage(), only="gpu")[0]
    assert [h.shown() for h in server.cards[0].holders] == [
        "team/q/main (4000MiB, 25%) binding remote from (not bound yet)",
        "team/r/main (4000MiB, 25%) remote from cpu"]
    assert server.cards[0].memory_booked == 8000
    holders = inspect_json([server])["nodes"][0]["cards"][0]["holders"]
    assert [h["remoteFrom"] for h in holders] == ["", "cpu"]
    local = inspect_json(views())["nodes"][0]["cards"][0]["holders"]
    assert {h["remoteFrom"] for h in local} == {None}


SINCE = dt.datetime(2027, 1, 15, 8, tzinfo=dt.UTC)
SERVER_LIVE = {"team/r": RemoteClientLive(True, 2, 4000, 25, memory_used_mib=1536, sm_percent=40,
                                          connected_since=SINCE),
               "team/u": RemoteClientLive(True, 1, 4000, 25, memory_used_mib=0),  # SM use not measured
               "team/o": RemoteClientLive(True, 1, 4000, 25),  # an older agent or server: no figures
               "team/q": RemoteClientLive(True, 0, 4000, 25), "team/n": RemoteClientLive(True, None, 4000, 25)}


class ServerReport:
    """A usage source whose node ``gpu`` reports remote clients r (2 connections), q (none) and n
    (connections not yet reported), lists nobody else, and whose node ``away`` could not be read."""

    def card_usage(self, node: str, uuid: str) -> CardUsageSample | None:
        return None

    def node_note(self, node: str) -> str | None:
        return "usage not read: 503 Service Unavailable" if node == "away" else None

    def remote_client(self, node: str, pod: str, uuid: str) -> RemoteClientLive | None:
        if node == "away":
            return None
        return SERVER_LIVE.get(pod, RemoteClientLive(listed=False)) if uuid == f"GPU-{node}-0" else None


def test_a_remote_share_shows_its_live_state_from_the_servers_report() -> None:
    nodes = [gpu_node("gpu", [16384]), gpu_node("away", [16384]), gpu_node("cpu", [])]
    pods = [remote_pod(name, "cpu", "gpu") for name in ("r", "u", "o", "q", "n", "s")] + [
        remote_pod("t", "cpu", "away"), placed("p1", "gpu", 0, 1)]
    shown = node_views(build_snapshot(nodes, pods, NAMES, now=NOW.timestamp()), ServerReport())
    away, _, server = shown
    assert [h.shown() for h in server.cards[0].holders] == [
        "team/n/main (4000MiB, 25%) remote from cpu, connections not reported",
        "team/o/main (4000MiB, 25%) remote from cpu, connected (1 connection)",
        "team/p1/main (256MiB, 0%)",
        "team/q/main (4000MiB, 25%) remote from cpu, booked, not connected",
        "team/r/main (4000MiB, 25%) remote from cpu, connected (2 connections) since 2027-01-15T08:00:00Z, "
        "1536MiB used, 40% SM",
        "team/s/main (4000MiB, 25%) remote from cpu, not in the node agent's report",
        "team/u/main (4000MiB, 25%) remote from cpu, connected (1 connection), 0MiB used"]
    assert [h.shown() for h in away.cards[0].holders] == ["team/t/main (4000MiB, 25%) remote from cpu"]
    table = inspect_table(shown)
    assert "remote from cpu, connected (2 connections) since 2027-01-15T08:00:00Z, 1536MiB used, 40% SM" in table
    assert "node away: usage not read" in table
    holders = {h["pod"]: h for h in inspect_json([server])["nodes"][0]["cards"][0]["holders"]}
    assert holders["team/r"]["remoteLive"] == {"listed": True, "connections": 2, "memoryLimitMiB": 4000,
                                               "computeSharePercent": 25, "memoryUsedMiB": 1536, "smPercent": 40,
                                               "connectedSince": "2027-01-15T08:00:00.000000Z"}
    assert holders["team/s"]["remoteLive"] == {"listed": False, "connections": None, "memoryLimitMiB": None,
                                               "computeSharePercent": None, "memoryUsedMiB": None,
                                               "smPercent": None, "connectedSince": None}
    assert holders["team/p1"]["remoteLive"] is None  # a local holder
    assert inspect_json([away])["nodes"][0]["cards"][0]["holders"][0]["remoteLive"] is None  # not read
