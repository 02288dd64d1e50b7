"""A GPU node serving remote shares shows them: a row per remote client on ``/usage``, per-client
and per-card series on ``/metrics``, and the remote shares inside the card's booked totals (the
extender books them on this node's card). Tokens never appear."""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.fields import AnnotationError
from gpupool.api.remote_connections import CONNECTIONS_FILE, ClientConnections, encode_connections
from gpupool.api.remote_gpu import RemoteClient, encode_clients
from gpupool.api.usage_report import (
    NodeUsageReport,
    RemoteClientUsageReport,
    decode_usage_report,
    encode_usage_report,
)
from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, Placement, Topology
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.metrics import card_reports, metrics_app
from gpupool.nodeagent.remote_usage import (
    UNKNOWN_CARD,
    RemoteBooked,
    RemoteClientRow,
    remote_booked,
    remote_client_rows,
    remote_table,
)
from gpupool.nodeagent.types import NodeAssignment, PodView
from tests.nodeagent.usage_world import NODE, agent_with_monitor

MIB = 1 << 20
TOKENS = ("a" * 43, "b" * 43, "c" * 43)
INVENTORY = GpuInventory((GpuCard(0, "GPU-0", "T4", 16384), GpuCard(1, "GPU-1", "T4", 16384)),
                         Topology.flat(2), ("/dev/nvidia0", "/dev/nvidia1"))


def clients_file(tmp_path: Path) -> Path:
    path = tmp_path / "remote-gpu-clients.json"
    path.write_text(encode_clients([
        RemoteClient(TOKENS[0], "ml/train-0", "GPU-1", 4096, 25),
        RemoteClient(TOKENS[1], "ml/infer-0", "GPU-1", 1024, 0),
        RemoteClient(TOKENS[2], "web/gone", "GPU-other", 512, 10)]))
    return path


SINCE = 1_800_000_000
"""2027-01-15T08:00:00Z, when ml/train-0's oldest connection was authenticated."""


def connected(tmp_path: Path) -> None:
    """The server's report: ml/train-0 has two connections (two processes) holding 1.5 GiB and a
    byte, using 40 % of the card's SMs, nobody else any."""
    (tmp_path / CONNECTIONS_FILE).write_text(encode_connections([
        ClientConnections("ml/train-0", "GPU-1", 2, 1536 * MIB + 1, SINCE, 40)]))


def test_rows_name_pod_card_and_share_ordered_and_without_tokens(tmp_path: Path) -> None:
    rows = remote_client_rows(clients_file(tmp_path), INVENTORY)
    assert rows == (RemoteClientRow("ml", "infer-0", 1, "GPU-1", 1024, 0),
                    RemoteClientRow("ml", "train-0", 1, "GPU-1", 4096, 25),
                    RemoteClientRow("web", "gone", UNKNOWN_CARD, "GPU-other", 512, 10))
    assert {r.connections for r in rows} == {None}  # the server said nothing yet
    assert not any(token in repr(rows) for token in TOKENS)
    assert remote_booked(rows) == {1: RemoteBooked(clients=2, memory_mib=5120, compute_permille=250)}
    connected(tmp_path)
    rows = remote_client_rows(clients_file(tmp_path), INVENTORY)
    assert [r.connections for r in rows] == [0, 2, 0]
    assert [(r.memory_used_bytes, r.connected_since, r.sm_percent) for r in rows] == [
        (None, None, None), (1536 * MIB + 1, SINCE, 40), (None, None, None)]  # not connected: nothing said
    (tmp_path / CONNECTIONS_FILE).write_text("{")
    assert [r.connections for r in remote_client_rows(clients_file(tmp_path), INVENTORY)] == [None] * 3


def test_a_client_of_two_cards_has_a_row_on_each_and_books_both(tmp_path: Path) -> None:
    """The server names the connection by the client's first card and says what it uses on all its
    cards together: that goes on the first card's row, the connections on both."""
    path = tmp_path / "remote-gpu-clients.json"
    path.write_text(encode_clients([RemoteClient(TOKENS[0], "ml/pair", "GPU-1", 4096, 25,
                                                 more_card_uuids=("GPU-0",))]))
    (tmp_path / CONNECTIONS_FILE).write_text(encode_connections([
        ClientConnections("ml/pair", "GPU-1", 1, 3 * MIB, SINCE, None)]))
    rows = remote_client_rows(path, INVENTORY)
    assert rows == (RemoteClientRow("ml", "pair", 0, "GPU-0", 4096, 25, 1),
                    RemoteClientRow("ml", "pair", 1, "GPU-1", 4096, 25, 1, 3 * MIB, SINCE, None))
    assert remote_booked(rows) == {0: RemoteBooked(1, 4096, 250), 1: RemoteBooked(1, 4096, 250)}


def test_an_absent_unset_or_broken_file_reports_no_client(tmp_path: Path) -> None:
    assert remote_client_rows(None, INVENTORY) == ()
    assert remote_client_rows(tmp_path / "absent.json", INVENTORY) == ()
    broken = tmp_path / "broken.json"
    broken.write_text('{"version": 1, "clients": [{"token": "short"}]}')
    assert remote_client_rows(broken, INVENTORY) == ()


def test_card_reports_add_remote_shares_to_the_booked_totals() -> None:
    placement = Placement("ml/p", NODE, 0, 0, (ContainerAssignment("c", (CardSlice(1, 2048, 100),)),))
    local = PodView("ml", "p", "uid-p", NODE, 0.0, False, (),
                    NodeAssignment(placement, {c.index: c.uuid for c in INVENTORY.cards}))
    reports = card_reports(NODE, INVENTORY, [local], remote={1: RemoteBooked(2, 5120, 250)})
    assert [(r.memory_booked_mib, r.compute_booked_permille, r.containers, r.remote_clients, r.remote_memory_mib)
            for r in reports] == [(0, 0, 0, 0, 0), (7168, 350, 1, 2, 5120)]


def test_the_table_lists_each_client_and_is_empty_without_any(tmp_path: Path) -> None:
    path = clients_file(tmp_path)
    assert remote_table(remote_client_rows(path, INVENTORY)).splitlines()[2].split()[-4:] == ["?", "-", "-", "-"]
    connected(tmp_path)
    lines = remote_table(remote_client_rows(path, INVENTORY)).splitlines()
    assert lines[1].startswith("REMOTE CLIENT NAMESPACE/POD") and lines[1].endswith("CONNECTED SINCE")
    assert lines[1].split()[-7:] == ["CONNECTIONS", "MEM", "USED", "MiB", "SM%", "CONNECTED", "SINCE"]
    assert lines[2].split() == ["ml/infer-0", "1", "1024", "-", "0", "-", "-", "-"]
    assert lines[3].split() == ["ml/train-0", "1", "4096", "25", "2", "1537", "40", "2027-01-15T08:00:00Z"]
    assert lines[4].split() == ["web/gone", "?", "512", "10", "0", "-", "-", "-"]
    assert remote_table(()) == ""


def series(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_metrics_and_usage_page_show_the_remote_clients(tmp_path: Path) -> None:
    path = clients_file(tmp_path)
    connected(tmp_path)

    async def main() -> tuple[str, str, str, str]:
        agent, monitor, _ = agent_with_monitor(tmp_path)
        try:
            await agent.pre_start("", [])
            await monitor.step()
            async with TestClient(TestServer(metrics_app(agent))) as client:
                before = await (await client.get("/metrics")).text()
            async with TestClient(TestServer(metrics_app(agent, remote_clients=path))) as client:
                return (before, await (await client.get("/metrics")).text(),
                        await (await client.get("/usage")).text(), await (await client.get("/usage.json")).text())
        finally:
            monitor.stop()

    before_text, text, page, document = asyncio.run(main())
    before, got = series(before_text), series(text)

    def card(index: int) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({"node": NODE, "card": str(index), "uuid": f"GPU-{index}", "model": "Tesla-T4"}.items()))

    def client(namespace: str, pod: str, index: int, uuid: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({"node": NODE, "namespace": namespace, "pod": pod, "card": str(index),
                             "uuid": uuid}.items()))

    assert got["gpupool_card_remote_clients"] == {card(0): 0, card(1): 2}
    assert got["gpupool_card_remote_memory_allocated_bytes"] == {card(0): 0, card(1): 5120 * MIB}
    allocated, was = got["gpupool_card_memory_allocated_bytes"], before["gpupool_card_memory_allocated_bytes"]
    assert allocated == {card(0): was[card(0)], card(1): was[card(1)] + 5120 * MIB}
    ratio, was_ratio = got["gpupool_card_compute_allocated_ratio"], before["gpupool_card_compute_allocated_ratio"]
    assert ratio[card(1)] == was_ratio[card(1)] + 0.25
    assert got["gpupool_remote_client_memory_limit_bytes"] == {
        client("ml", "infer-0", 1, "GPU-1"): 1024 * MIB, client("ml", "train-0", 1, "GPU-1"): 4096 * MIB,
        client("web", "gone", -1, "GPU-other"): 512 * MIB}
    assert got["gpupool_remote_client_compute_share_ratio"][client("ml", "train-0", 1, "GPU-1")] == 0.25
    assert got["gpupool_remote_client_connections"] == {
        client("ml", "infer-0", 1, "GPU-1"): 0, client("ml", "train-0", 1, "GPU-1"): 2,
        client("web", "gone", -1, "GPU-other"): 0}
    train = client("ml", "train-0", 1, "GPU-1")
    assert got["gpupool_remote_client_memory_used_bytes"] == {train: 1536 * MIB + 1}  # only the connected
    assert got["gpupool_remote_client_sm_utilization_ratio"] == {train: 0.4}
    assert got["gpupool_remote_client_connected_since_timestamp_seconds"] == {train: SINCE}
    assert before["gpupool_card_remote_clients"] == {card(0): 0, card(1): 0}
    assert "gpupool_remote_client_memory_limit_bytes" not in before
    assert "ml/train-0" in page and "REMOTE CLIENT" in page
    assert decode_usage_report(document).remote_clients == (
        RemoteClientUsageReport("ml", "infer-0", 1, "GPU-1", 1024, 0, 0),
        RemoteClientUsageReport("ml", "train-0", 1, "GPU-1", 4096, 25, 2, memory_used_mib=1537,  # rounded up
                                connected_since=dt.datetime(2027, 1, 15, 8, tzinfo=dt.UTC), sm_percent=40),
        RemoteClientUsageReport("web", "gone", -1, "GPU-other", 512, 10, 0))
    assert '"connectedSince": "2027-01-15T08:00:00.000000Z"' in document
    assert not any(token in text or token in page or token in document for token in TOKENS)


def test_the_usage_document_carries_remote_clients_only_when_there_are_some() -> None:
    report = NodeUsageReport("n1", "none", 600.0, (), ())
    assert "remoteClients" not in encode_usage_report(report)
    assert decode_usage_report(encode_usage_report(report)) == report
    served = replace(report, remote_clients=(RemoteClientUsageReport("ml", "a", 0, "GPU-0", 512, 0, None),))
    assert decode_usage_report(encode_usage_report(served)) == served
    broken = encode_usage_report(served).replace('"memoryLimitMiB": 512', '"memoryLimitMiB": "512"')
    with pytest.raises(AnnotationError, match=r"remoteClients\[0\]"):
        decode_usage_report(broken)
    assert '"memoryUsedMiB"' not in encode_usage_report(served)  # not reported: absent, not 0
    using = replace(report, remote_clients=(RemoteClientUsageReport(
        "ml", "a", 0, "GPU-0", 512, 0, 1, 300, dt.datetime(2027, 1, 15, 8, 0, 1, tzinfo=dt.UTC), 12),))
    assert decode_usage_report(encode_usage_report(using)) == using
    with pytest.raises(AnnotationError, match=r"remoteClients\[0\]\.connectedSince"):
        decode_usage_report(encode_usage_report(using).replace("2027-01-15T08:00:01.000000Z", "soon"))
