"""A pod that ends gives its booking back at once, and the extender counts and logs each release by
how the pod ended (deleted, finished, cleared): the liveness report of docs/security.md."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gpupool.extender.booking_keeper import ENDED_CLEARED, ENDED_DELETED, ENDED_FINISHED
from gpupool.extender.cache import ClusterCache
from gpupool.extender.metrics import ExtenderMetrics, LedgerTotals
from tests.extender.test_metrics import scrape, serve
from tests.kube.builders import node, placed_pod

Ending = Callable[[ClusterCache, dict[str, Any]], None]


def _phase(phase: str) -> Ending:
    def end(cache: ClusterCache, raw: dict[str, Any]) -> None:
        ended = copy.deepcopy(raw)
        ended["status"] = {**ended.get("status", {}), "phase": phase}
        cache.upsert_pod(ended)
    return end


def _delete(cache: ClusterCache, raw: dict[str, Any]) -> None:
    cache.remove_pod(raw)


def _clear(cache: ClusterCache, raw: dict[str, Any]) -> None:
    cleared = copy.deepcopy(raw)
    cleared["metadata"]["annotations"] = {}
    cleared["spec"]["nodeName"] = ""
    cache.upsert_pod(cleared)


def _booked_cache() -> tuple[ClusterCache, dict[str, Any]]:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("N1", [16276, 16276])])
    raw = placed_pod("a", "N1", 0, 8138)
    cache.replace_pods([raw, placed_pod("b", "N1", 0, 4069)])
    assert "default/a" in cache.state.placements
    return cache, raw


@pytest.mark.parametrize("end, reason", [
    pytest.param(_phase("Succeeded"), ENDED_FINISHED, id="succeeded"),
    pytest.param(_phase("Failed"), ENDED_FINISHED, id="failed-eg-refused-by-the-node"),
    pytest.param(_delete, ENDED_DELETED, id="deleted"),
    pytest.param(_clear, ENDED_CLEARED, id="assignment-cleared"),
])
def test_an_ended_pod_releases_its_booking_at_once_and_is_counted(
        end: Ending, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    cache, raw = _booked_cache()
    with caplog.at_level("INFO", logger="gpupool.extender.booking_keeper"):
        end(cache, raw)
    assert "default/a" not in cache.state.placements
    assert "default/b" in cache.state.placements
    assert dict(cache.released_bookings) == {reason: 1}
    assert [r.getMessage() for r in caplog.records if "released its booking" in r.getMessage()] == [
        f"pod default/a {reason}: released its booking on node N1 (cards [0])"]
    end(cache, raw)  # the same ending seen again (a re-list, a late event) is not a second release
    assert sum(cache.released_bookings.values()) == 1


def test_a_pod_that_held_nothing_releases_nothing() -> None:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("N1", [16276])])
    raw = placed_pod("a", "N1", 0, 8138)
    cache.remove_node("N1")  # its booking waits for the node: nothing in the ledger
    cache.replace_pods([raw])
    cache.remove_pod(raw)
    assert sum(cache.released_bookings.values()) == 0


def test_releases_are_exported_by_reason() -> None:
    cache, raw = _booked_cache()
    _phase("Failed")(cache, raw)
    assert dict(LedgerTotals.read(cache).bookings_released) == {
        ENDED_DELETED: 0, ENDED_FINISHED: 1, ENDED_CLEARED: 0}

    async def scenario(client: TestClient, _: ClusterCache, __: ExtenderMetrics) -> None:
        got = await scrape(client)
        assert got[("gpupool_extender_bookings_released_total", (("reason", ENDED_FINISHED),))] == 1
        assert got[("gpupool_extender_bookings_released_total", (("reason", ENDED_DELETED),))] == 0

    serve(scenario, cache)
