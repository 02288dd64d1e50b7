"""Usage read from the node agents: one report per node, every failure a note, never an exception."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time

import pytest

from gpupool.api.usage_report import CardUsageReport, NodeUsageReport, RemoteClientUsageReport, encode_usage_report
from gpupool.kubectl.agent_usage import AgentUsage
from gpupool.kubectl.connection import ClusterAccessError
from gpupool.kubectl.usage import CardUsageSample, RemoteClientLive


def report(node: str, utilization: int | None = 40) -> str:
    cards = (CardUsageReport(0, f"GPU-{node}-0", "T4", "busy", utilization, 2048, 16384, 1, 0.0),
             CardUsageReport(1, f"GPU-{node}-1", "T4", "free", 0, 0, 16384, 0, 0.0))
    return encode_usage_report(NodeUsageReport(node, "proc-scan", 600.0, cards, ()))


ANSWERS: dict[str, str | Exception] = {
    "ok": report("ok"),
    "refused": ClusterAccessError("503 Service Unavailable: dial tcp 10.0.0.9:9410: connect: connection refused"),
    "forbidden": ClusterAccessError('403 Forbidden: nodes "forbidden" is forbidden: cannot get resource '
                                    '"nodes/proxy"'),
    "socket": OSError("connection reset"),
    "garbage": "<html>not json</html>",
    "other": report("elsewhere"),
    "unsampled": report("unsampled", utilization=None),
}


def read(node: str, port: int, path: str, timeout_s: float) -> str:
    answer = ANSWERS[node]
    if isinstance(answer, Exception):
        raise answer
    return answer


@pytest.fixture
def usage() -> AgentUsage:
    source = AgentUsage(read, port=9410, timeout_s=1.0)
    source.fetch(ANSWERS)
    return source


def test_a_reporting_agent_fills_its_cards(usage: AgentUsage) -> None:
    assert usage.card_usage("ok", "GPU-ok-0") == CardUsageSample(40.0, 2048)
    assert usage.card_usage("ok", "GPU-ok-1") == CardUsageSample(0.0, 0)
    assert usage.card_usage("ok", "GPU-ok-9") is None and usage.node_note("ok") is None


@pytest.mark.parametrize(("node", "note"), [
    pytest.param("refused", "503 Service Unavailable: dial tcp", id="agent-down"),
    pytest.param("forbidden", "cannot get resource \"nodes/proxy\"", id="no-rbac"),
    pytest.param("socket", "connection reset", id="socket-error"),
    pytest.param("garbage", "usage report: not valid JSON", id="not-a-report"),
    pytest.param("other", "the agent there reports for node 'elsewhere'", id="wrong-node"),
])
def test_a_node_without_a_usable_report_has_a_note_and_no_usage(usage: AgentUsage, node: str, note: str) -> None:
    assert usage.card_usage(node, f"GPU-{node}-0") is None
    text = usage.node_note(node)
    assert text is not None and text.startswith("usage not read from the node agent (port 9410): ") and note in text


def test_a_card_missing_from_the_agents_sample_is_unknown_not_zero(usage: AgentUsage) -> None:
    assert usage.card_usage("unsampled", "GPU-unsampled-0") is None
    assert usage.card_usage("unsampled", "GPU-unsampled-1") == CardUsageSample(0.0, 0)


def test_nodes_are_asked_in_parallel() -> None:
    started: list[str] = []
    lock = threading.Lock()

    def slow(node: str, port: int, path: str, timeout_s: float) -> str:
        with lock:
            started.append(node)
        time.sleep(0.3)
        return report(node)

    begin = time.monotonic()
    AgentUsage(slow).fetch([f"n{i}" for i in range(8)])
    assert len(started) == 8 and time.monotonic() - begin < 1.5  # one after another: 2.4 s


def serving(node: str, *clients: RemoteClientUsageReport) -> str:
    """A GPU server's report listing ``clients`` under ``remoteClients``."""
    cards = (CardUsageReport(0, f"GPU-{node}-0", "T4", "busy", 10, 1024, 16384, 1, 0.0),)
    return encode_usage_report(NodeUsageReport(node, "proc-scan", 600.0, cards, (), clients))


def test_remote_clients_come_from_the_serving_nodes_report() -> None:
    since = dt.datetime(2027, 1, 15, 8, tzinfo=dt.UTC)
    answers = {"gpu": serving("gpu", RemoteClientUsageReport("ml", "r", 0, "GPU-gpu-0", 4000, 25, 2, 1536, since, 40),
                              RemoteClientUsageReport("ml", "idle", 0, "GPU-gpu-0", 2000, 10, 0),
                              RemoteClientUsageReport("ml", "new", 0, "GPU-gpu-0", 1000, 5, None)),
               "down": ClusterAccessError("503 Service Unavailable")}

    def answer(node: str, port: int, path: str, timeout_s: float) -> str:
        found = answers[node]
        if isinstance(found, Exception):
            raise found
        return found

    source = AgentUsage(answer)
    source.fetch(answers)
    assert source.remote_client("gpu", "ml/r", "GPU-gpu-0") == RemoteClientLive(
        True, 2, 4000, 25, memory_used_mib=1536, sm_percent=40, connected_since=since)
    assert source.remote_client("gpu", "ml/idle", "GPU-gpu-0") == RemoteClientLive(True, 0, 2000, 10)
    assert source.remote_client("gpu", "ml/new", "GPU-gpu-0") == RemoteClientLive(True, None, 1000, 5)
    assert source.remote_client("gpu", "ml/r", "GPU-gpu-1") == RemoteClientLive(listed=False)  # another card
    assert source.remote_client("down", "ml/r", "GPU-down-0") is None  # not read: the node note says why


def test_an_older_agents_report_without_remote_clients_lists_nobody() -> None:
    old = json.loads(report("old"))
    assert "remoteClients" not in old  # the shape an agent from before remote GPUs sends
    source = AgentUsage(lambda *ask: json.dumps(old))
    source.fetch(["old"])
    assert source.node_note("old") is None and source.card_usage("old", "GPU-old-0") == CardUsageSample(40.0, 2048)
    assert source.remote_client("old", "ml/r", "GPU-old-0") == RemoteClientLive(listed=False)


def test_an_older_agents_remote_clients_without_use_still_decode() -> None:
    """An agent from before the per-client use lists connections only: the figures are unknown."""
    old = json.loads(serving("gpu", RemoteClientUsageReport("ml", "r", 0, "GPU-gpu-0", 4000, 25, 2)))
    assert set(old["remoteClients"][0]) == {"namespace", "pod", "card", "uuid", "memoryLimitMiB",
                                            "computeSharePercent", "connections"}  # that agent's shape
    source = AgentUsage(lambda *ask: json.dumps(old))
    source.fetch(["gpu"])
    live = source.remote_client("gpu", "ml/r", "GPU-gpu-0")
    assert live == RemoteClientLive(True, 2, 4000, 25)
    assert live is not None and live.shown() == "connected (2 connections)"
