"""Answers written from per-node records (padded, gathered by ledger row) are the plain JSON lists."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.api.names import ResourceNames
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.http.host_records import HostRecords, RecordsForLayout
from gpupool.extender.http.wire import FilterResult, parse_extender_args
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService, NodeScores
from gpupool.kube.translate import pod_request
from tests.extender.modes import EVERY_FIT
from tests.kube.builders import container, node, placed_pod, pod


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=10), min_size=1, max_size=25, unique=True), st.data())
def test_records_decode_to_the_plain_lists(names: list[str], data: st.DataObject) -> None:
    """Any names (quotes, backslashes, control characters, non-ASCII), any rows in any order with
    repeats, any scores 0..10: the padded answer decodes to exactly the compact one."""
    records = HostRecords.build(names)
    if records is None:  # padding would grow the answer too much: only for very uneven names
        quoted = [len(json.dumps(n, ensure_ascii=False).encode()) for n in names]
        assert max(quoted) * len(quoted) > 1.5 * sum(quoted)
        return
    rows = data.draw(st.lists(st.integers(0, len(names) - 1), max_size=40))
    scores = data.draw(st.lists(st.integers(0, 10), min_size=len(rows), max_size=len(rows)))
    row_array = np.array(rows, dtype=np.int64)
    priority = records.priority_list(row_array, np.array(scores, dtype=np.int64))
    assert json.loads(priority) == [{"Host": names[r], "Score": s} for r, s in zip(rows, scores, strict=True)]
    assert json.loads(records.name_list(row_array)) == [names[r] for r in rows]


def test_a_name_much_longer_than_the_rest_gets_no_table() -> None:
    short = [f"n{i}" for i in range(50)]
    assert HostRecords.build(short) is not None
    assert HostRecords.build([*short, "x" * 500]) is None
    empty = HostRecords.build([])
    assert empty is not None and empty.name_list(np.zeros(0, dtype=np.int64)) == b"[]"


def test_records_are_rebuilt_for_a_new_layout_only() -> None:
    """The table belongs to one layout number: another number gets a new table, built from that
    layout's names, so rows are never read against the names of another layout; a number whose
    names the service no longer has gets no table (the answer is written the compact way)."""
    layouts = {1: ("a", "b"), 2: ("b", "c")}
    asked: list[int] = []

    def names_of(layout: int) -> tuple[str, ...] | None:
        asked.append(layout)
        return layouts.get(layout)

    chooser = RecordsForLayout(names_of)
    first, second = 1, 2  # in layout 2, row 0 means another node
    table = chooser.for_layout(first)
    assert table is not None and chooser.for_layout(first) is table and asked == [1]
    answer = chooser.priority_list(NodeScores(["b", "c"], np.array([3, 10]), np.array([0, 1]), second))
    assert answer is not None and json.loads(answer) == [{"Host": "b", "Score": 3}, {"Host": "c", "Score": 10}]
    # nothing to write from: no rows, a score out of range, or rows not aligned with the hosts
    assert chooser.priority_list(NodeScores(["b"], np.array([3]))) is None
    assert chooser.priority_list(NodeScores(["b"], np.array([11]), np.array([0]), second)) is None
    assert chooser.name_list(["b", "c"], np.array([0]), second) is None
    assert chooser.for_layout(3) is None and chooser.name_list(["a"], np.array([0]), 3) is None


def _service(names: list[str]) -> tuple[ClusterCache, ExtenderService]:
    """Filter then prioritize, as under the ``-prioritize.yaml`` configurations: the filter passes
    every node that fits (:data:`EVERY_FIT`, not the shipped mode), prioritize scores them."""
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node(n, [16276, 16276]) for n in names])
    cache.replace_pods([])
    return cache, ExtenderService(cache, None, settings=EVERY_FIT)


def test_service_answers_name_their_ledger_rows() -> None:
    """Filter and prioritize (from the filter's memo and afresh) give rows that name their hosts in
    the layout they carry; a list with a node the ledger does not know carries no rows."""
    cache, service = _service(["N1", "N2", "N3"])
    request = pod_request(pod("p", container(mib=8138)), cache.names)
    cache.upsert_pod(placed_pod("full-0", "N2", 0, 16276))
    cache.upsert_pod(placed_pod("full-1", "N2", 1, 16276))
    outcome = service.filter(request, ["N3", "N1", "N2"])
    assert outcome.rows is not None and outcome.layout is not None
    assert outcome.passed == ["N3", "N1"] and "N2" in outcome.failed
    names_of = service.row_names(outcome.layout)
    assert names_of is not None and [names_of[r] for r in outcome.rows] == outcome.passed
    for names in (outcome.passed, ["N2", "N1"]):  # the memo's list, then one scored afresh
        scores, _ = service.prioritize(request, list(names))
        assert scores.rows is not None and scores.layout is not None
        row_names = service.row_names(scores.layout)
        assert row_names is not None and [row_names[r] for r in scores.rows] == scores.hosts == list(names)
    scores, _ = service.prioritize(request, ["N1", "nowhere"])
    assert scores.rows is None and scores.hosts == ["N1", "nowhere"]

    # rows keep their names when a node is replaced or removed: the same number (no table rebuilt);
    # a node added names a new row: a new number, and the old one's names are gone
    before = service.filter(request, ["N1"]).layout
    cache.upsert_node(node("N1", [16276, 16276], model="Tesla-T4"))
    cache.remove_node("N3")
    assert service.filter(request, ["N1"]).layout == before
    cache.upsert_node(node("N4", [16276]))
    after = service.filter(request, ["N1", "N4"]).layout
    assert before is not None and after is not None and after != before
    assert service.row_names(after) == ("N1", "N2", "N3", "N4") and service.row_names(before) is None


def test_http_answers_from_records_are_the_compact_documents() -> None:
    """Through the endpoints, on a ledger that changes between calls: the filter and prioritize
    answers written from records decode to the documents the plain encoders write."""
    names = [f"node-{i}" for i in range(12)]

    async def main() -> None:
        cache, service = _service(names)
        api = ExtenderApi(service, ResourceNames(), ExtenderMetrics(ledger=cache), requests=cache.requests)
        async with TestClient(TestServer(api.app())) as client:
            for i in range(6):
                p = pod(f"p{i}", container(mib=4069 * (1 + i % 4)))
                asked = names[i:] + names[:i]
                resp = await client.post("/filter", data=json.dumps({"Pod": p, "NodeNames": asked}))
                raw = await resp.read()
                request = pod_request(p, cache.names)
                plain = service.filter(request, asked)
                doc: dict[str, Any] = {"Pod": p, "NodeNames": asked}
                expected = FilterResult(plain.passed, plain.failed, plain.error).to_json(parse_extender_args(doc))
                assert json.loads(raw) == json.loads(json.dumps(expected))
                assert b'"NodeNames":["' + plain.passed[0].encode() + b'"' in raw  # written from records
                resp = await client.post("/prioritize", data=json.dumps({"Pod": p, "NodeNames": plain.passed}))
                body = json.loads(await resp.read())
                scores, _ = service.prioritize(request, plain.passed)
                assert body == [{"Host": h, "Score": s} for h, s in scores.as_dict().items()]
                best = max(body, key=lambda e: e["Score"])["Host"]
                cache.reserve(request, best)
                if i == 3:
                    cache.remove_node(names[-1])
                    cache.upsert_node(node("late-node", [16276]))

    asyncio.run(main())


def test_the_full_node_list_stays_mapped_while_filters_leave_many_passed_lists() -> None:
    """Every filter remembers the list of nodes that passed (for prioritize); more than the memo
    holds must not push out the full list that every filter sends (a 5,000-name miss costs ~1 ms)."""
    names = [f"n{i:02d}" for i in range(20)]
    cache, service = _service(names)
    mapped: list[int] = []
    remember = service.node_rows.remember

    def counting(state: Any, listed: list[str], found: Any) -> None:
        mapped.append(len(listed))
        remember(state, listed, found)

    service.node_rows.remember = counting  # type: ignore[method-assign]
    for i in range(12):  # each filter leaves another passed list, after one more node filled up
        request = pod_request(pod(f"p{i}", container(gpu=2)), cache.names)
        outcome = service.filter(request, names)
        assert len(outcome.passed) == len(names) - i
        cache.reserve(request, outcome.passed[0])
    assert mapped.count(len(names)) == 1  # the full list was mapped once, then always found
