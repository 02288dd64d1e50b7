"""The node agent's ``/metrics``: each card with what gpupool's assignments book on it, as the
extender's ledger would book them, read from the pods kubelet lists on the node."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, NodeSpec, Placement, Topology
from gpupool.core.state import ClusterState
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.gpu_inventory import GpuInventory, HealthEvent
from gpupool.nodeagent.metrics import card_reports, metrics_app, serve_metrics
from gpupool.nodeagent.types import NodeAssignment, PodView
from gpupool.testing.node_workload import generate
from tests.nodeagent.harness import fake_pod, running_node

MIB = 1 << 20

NODE = "node-a"
CARDS = (GpuCard(0, "GPU-0", "T4", 16384), GpuCard(1, "GPU-1", "T4", 16384))
INVENTORY = GpuInventory(CARDS, Topology.flat(2), ("/dev/nvidia0", "/dev/nvidia1"))


def view(name: str, *containers: ContainerAssignment, node: str = NODE, terminated: bool = False) -> PodView:
    placement = Placement(f"ns/{name}", node, 0, 0, containers)
    return PodView("ns", name, f"uid-{name}", node, 0.0, terminated, (),
                   NodeAssignment(placement, {c.index: c.uuid for c in CARDS}))


def app(name: str, *slices: CardSlice) -> ContainerAssignment:
    return ContainerAssignment(name, slices)


def init(name: str, *slices: CardSlice) -> ContainerAssignment:
    return ContainerAssignment(name, slices, init=True)


@pytest.mark.parametrize(("pods", "expected"), [
    pytest.param([view("a", app("m", CardSlice(0, 4096, 300))), view("b", app("m", CardSlice(0, 2048, 200)))],
                 [(6144, 500, 2), (0, 0, 0)], id="slices-of-two-pods-add-up"),
    pytest.param([view("a", app("m", CardSlice(0, 4096, 300), CardSlice(1, 4096, 300)))],
                 [(4096, 300, 1), (4096, 300, 1)], id="a-slice-across-two-cards"),
    pytest.param([view("a", init("warm", CardSlice(1, 8192, 500)), app("m", CardSlice(1, 2048, 100)))],
                 [(0, 0, 0), (8192, 500, 1)], id="an-init-container-holds-its-card-alone"),
    pytest.param([view("a", app("m", CardSlice(1, 16384, 1000, exclusive=True)))],
                 [(0, 0, 0), (16384, 1000, 1)], id="a-whole-card"),
    pytest.param([view("a", app("m", CardSlice(0, 4096, 300)), terminated=True)],
                 [(0, 0, 0), (0, 0, 0)], id="a-finished-pod-holds-nothing"),
    pytest.param([view("a", app("m", CardSlice(0, 4096, 300)), node="node-b")],
                 [(0, 0, 0), (0, 0, 0)], id="an-assignment-for-another-node-holds-nothing"),
    pytest.param([view("a", app("m", CardSlice(7, 4096, 300)), app("n", CardSlice(0, 1024, 0)))],
                 [(1024, 0, 1), (0, 0, 0)], id="a-card-the-node-lacks-is-not-reported"),
])
def test_card_reports(pods: list[PodView], expected: list[tuple[int, int, int]]) -> None:
    reports = card_reports(NODE, INVENTORY, pods)
    assert [r.card for r in reports] == list(CARDS)
    assert [(r.memory_booked_mib, r.compute_booked_permille, r.containers) for r in reports] == expected


def test_prepared_dra_claims_are_booked_beside_the_pods() -> None:
    """The extender books DRA claims and device-plugin pods in one ledger; the node's per-card series
    must show both, or a card full of claims would look empty to an admin."""
    pods = [view("a", app("m", CardSlice(0, 4096, 300)))]
    claims = [view("claim c1", app("c1", CardSlice(0, 6144, 0))),
              view("claim c2", app("c2", CardSlice(1, 16384, 1000, exclusive=True)))]
    reports = card_reports(NODE, INVENTORY, pods, claims)
    assert [(r.memory_booked_mib, r.compute_booked_permille, r.containers, r.claims) for r in reports] == [
        (10240, 300, 1, 1), (16384, 1000, 0, 1)]


@pytest.mark.slow
def test_a_scrape_counts_the_dra_drivers_claims() -> None:
    gpu_file: dict[str, Any] = {"model": "Tesla-T4", "cards": [{"uuid": "GPU-x0", "memoryMiB": 15360},
                                                              {"uuid": "GPU-x1", "memoryMiB": 15360}]}

    async def main() -> str:
        async with running_node(gpu_file) as node:
            node.agent.claims_granted = lambda: [view("claim c1", app("c1", CardSlice(1, 2048, 100)))]
            return await scrape(node.agent)

    got = by_card(asyncio.run(main()))
    assert got["gpupool_card_dra_claims"] == {"0": 0, "1": 1}
    assert got["gpupool_card_memory_allocated_bytes"] == {"0": 0, "1": 2048 * MIB}


def by_card(text: str) -> dict[str, dict[str, float]]:
    """Per-card samples of an exposition text: metric name → card index → value; checks the labels."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "gpupool_card_isolation_backend":  # one sample per backend: its own label
                assert set(s.labels) == {"node", "card", "uuid", "model", "backend"}
            elif "card" in s.labels:
                assert set(s.labels) == {"node", "card", "uuid", "model"}
                out.setdefault(s.name, {})[s.labels["card"]] = s.value
    return out


def unlabelled(text: str) -> dict[str, float]:
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if not s.labels}


@pytest.mark.slow
def test_a_scrape_shows_what_the_ledger_would_book_on_each_card() -> None:
    """Forty generated pods (slices, whole cards, GPU init containers, sidecars) admitted by the fake
    kubelet: per card, the agent's series equal the core ledger's booking of the same placements."""
    gpu_file, pods = generate(40, cards=4, seed=3, node=NODE)
    cards = tuple(GpuCard(i, c["uuid"], gpu_file["model"], c["memoryMiB"]) for i, c in enumerate(gpu_file["cards"]))
    ledger = ClusterState([NodeSpec(NODE, 10**7, 10**8, cards)], max_cards=4)
    for p in pods:
        ledger.apply(p.placement)
    usage = ledger.card_usage(NODE)

    async def main() -> None:
        async with running_node(gpu_file, [p.json for p in pods]) as node:
            await node.kubelet.handle_pod_additions([fake_pod(p.json) for p in pods])
            await node.kubelet.wait_idle(60)
            await node.agent.pre_start("", [])  # one more PodResources read, as the poller does
            node.backend.inject(HealthEvent(2, healthy=False, reason="XID 79"))
            await node.agent.apply_health(HealthEvent(2, healthy=False, reason="XID 79"))
            text = await scrape(node.agent)
            calls = node.kubelet.allocate_calls
        got = by_card(text)
        assert got["gpupool_card_memory_allocated_bytes"] == {
            str(u.card): (u.memory_total - u.memory_free) * MIB for u in usage}
        assert got["gpupool_card_compute_allocated_ratio"] == {
            str(u.card): (u.compute_total - u.compute_free) / 1000 for u in usage}
        assert got["gpupool_card_memory_total_bytes"] == {str(c.index): c.memory_mib * MIB for c in cards}
        assert got["gpupool_card_compute_total_ratio"] == {str(c.index): 1.0 for c in cards}
        assert got["gpupool_card_healthy"] == {"0": 1, "1": 1, "2": 0, "3": 1}
        app_containers = [a for p in pods for a in p.placement.containers if not a.init]
        assert sum(got["gpupool_card_containers"].values()) == sum(len(set(a.cards)) for a in app_containers)
        totals = unlabelled(text)
        assert totals["gpupool_node_containers_served"] == sum(len(p.placement.containers) for p in pods)
        assert totals["gpupool_node_allocate_refused_total"] == 0
        assert totals["gpupool_node_allocation_mismatches_total"] == 0
        answered = {s.labels["basis"]: s.value for family in text_string_to_metric_families(text)
                    for s in family.samples if s.name == "gpupool_node_allocations_total"}
        assert set(answered) <= {"unique", "newest"} and sum(answered.values()) == calls > 0

    asyncio.run(main())


async def scrape(agent: NodeAgent) -> str:
    async with TestClient(TestServer(metrics_app(agent))) as client:
        response = await client.get("/metrics")
        assert response.status == 200
        return await response.text()


@pytest.mark.slow
def test_labels_name_the_node_and_each_card() -> None:
    gpu_file: dict[str, Any] = {"model": "Tesla-T4", "cards": [{"uuid": "GPU-x0", "memoryMiB": 15360}]}

    async def main() -> None:
        async with running_node(gpu_file) as node:
            text = await scrape(node.agent)
        [sample] = [s for f in text_string_to_metric_families(text) for s in f.samples
                    if s.name == "gpupool_card_memory_total_bytes"]
        assert sample.labels == {"node": NODE, "card": "0", "uuid": "GPU-x0", "model": "Tesla-T4"}
        assert sample.value == 15360 * MIB  # bytes: Prometheus's base unit, not the inventory's MiB

    asyncio.run(main())


@pytest.mark.slow
def test_a_port_in_use_is_logged_not_raised_and_a_free_one_serves(caplog: pytest.LogCaptureFixture) -> None:
    gpu_file: dict[str, Any] = {"model": "Tesla-T4", "cards": [{"uuid": "GPU-x0", "memoryMiB": 15360}]}

    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            async with running_node(gpu_file) as node:
                assert await serve_metrics(node.agent, taken.getsockname()[1], "127.0.0.1") is None
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", 0))
                    port = probe.getsockname()[1]
                runner = await serve_metrics(node.agent, port, "127.0.0.1")
                assert runner is not None
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
                    answer = (await reader.read()).decode()
                    writer.close()
                    assert " 200 OK" in answer.splitlines()[0] and "gpupool_card_memory_total_bytes" in answer
                finally:
                    await runner.cleanup()

    asyncio.run(main())
    assert "cannot listen" in caplog.text
