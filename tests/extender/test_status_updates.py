"""A status-only update carries a pod's record over instead of reading the pod again; every change
of what the record is read from (the end of the pod, an annotation, a label, the spec) is still read,
and a deletion still releases (gpupool.extender.status_updates)."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest

import gpupool.extender.cache as cache_module
from gpupool.api.annotations import Allocated, encode_allocated
from gpupool.api.names import ResourceNames
from gpupool.extender.booking_keeper import ENDED_CLEARED, ENDED_DELETED, ENDED_FINISHED
from gpupool.extender.bookings import Stage
from gpupool.extender.cache import ClusterCache
from gpupool.extender.pod_records import read_pod
from gpupool.extender.status_updates import carried_over, listed_key
from gpupool.kube.pod_holding import PodRecord
from tests.kube.builders import container, node, placed_pod, pod

KEY = "default/a"
CONFIRMED = encode_allocated(Allocated("N1", dt.datetime(2026, 11, 29, tzinfo=dt.UTC)))
"""The node agent's confirmation (``allocated-v1``) of a pod on N1."""
Change = Callable[[dict[str, Any]], None]


def _updated(raw: dict[str, Any], *changes: Change, version: str = "7") -> dict[str, Any]:
    """A fresh copy of ``raw`` (as the watch decodes every event anew) at ``version``, changed."""
    new = copy.deepcopy(raw)
    new["metadata"]["resourceVersion"] = version
    for change in changes:
        change(new)
    return new


def _running(raw: dict[str, Any]) -> None:
    """KWOK's (or the kubelet's) update: status, its managedFields entry."""
    raw["status"] = {"phase": "Running", "podIP": "10.0.0.7", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T12:00:00Z"}]}
    raw["metadata"]["managedFields"] = [{"manager": "kwok", "operation": "Update", "subresource": "status",
                                         "time": "2026-11-29T12:00:00Z"}]


def _phase(phase: str) -> Change:
    def change(raw: dict[str, Any]) -> None:
        raw["status"] = {"phase": phase}
    return change


def _annotation(name: str, value: str) -> Change:
    def change(raw: dict[str, Any]) -> None:
        raw["metadata"]["annotations"][name] = value
    return change


def _cleared(raw: dict[str, Any]) -> None:
    raw["metadata"]["annotations"] = {}
    raw["spec"]["nodeName"] = ""


def _labelled(raw: dict[str, Any]) -> None:
    raw["metadata"]["labels"] = {"team": "a"}


def _deleting(raw: dict[str, Any]) -> None:
    raw["metadata"]["deletionTimestamp"] = "2026-11-29T12:00:00Z"


def _moved(raw: dict[str, Any]) -> None:
    raw["spec"]["nodeName"] = "N2"


def _bigger(raw: dict[str, Any]) -> None:
    raw["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "2"


class CountingReads:
    """``read_pod`` as the cache calls it, counted."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> PodRecord | None:
        self.calls += 1
        return read_pod(*args, **kwargs)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> CountingReads:
    counting = CountingReads()
    monkeypatch.setattr(cache_module, "read_pod", counting)
    return counting


def _booked() -> tuple[ClusterCache, dict[str, Any]]:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("N1", [16276, 16276]), node("N2", [16276])])
    raw = placed_pod("a", "N1", 0, 8138)
    cache.upsert_pod(raw)
    assert cache.bookings[KEY].stage is Stage.BOUND
    return cache, raw


def test_a_status_only_update_keeps_the_record_without_reading_the_pod(reads: CountingReads) -> None:
    cache, raw = _booked()
    before = cache.pods[KEY]
    booked = cache.state.placements[KEY]
    reads.calls = 0
    running = _updated(raw, _running)
    cache.upsert_pod(running)
    assert reads.calls == 0
    record = cache.pods[KEY]
    assert record.version == "7" and record.raw is running  # the binder writes with the current version
    assert cache.pod_object(KEY) == running
    assert (record.request, record.assignment, record.node_name, record.finished) == \
        (before.request, before.assignment, before.node_name, before.finished)
    assert cache.state.placements[KEY] == booked and cache.bookings[KEY].stage is Stage.BOUND


@pytest.mark.parametrize("change, kept", [
    pytest.param(_phase("Succeeded"), False, id="succeeded"),
    pytest.param(_phase("Failed"), False, id="failed"),
    pytest.param(_cleared, False, id="assignment-cleared"),
    pytest.param(_annotation("gpupool.io/allocated-v1", CONFIRMED), True, id="confirmed-by-the-node"),
    pytest.param(_annotation("example.com/note", "x"), True, id="other-annotation"),
    pytest.param(_labelled, True, id="label"),
    pytest.param(_deleting, True, id="deletion-timestamp"),
    pytest.param(_moved, True, id="node-name"),
    pytest.param(_bigger, True, id="container-resources"),
])
def test_every_change_of_what_the_record_reads_is_read_again(
        reads: CountingReads, change: Change, kept: bool) -> None:
    cache, raw = _booked()
    cache.upsert_pod(_updated(raw, _running, version="5"))
    reads.calls = 0
    changed = _updated(raw, _running, change)
    cache.upsert_pod(changed)
    assert reads.calls == 1
    assert cache.pods[KEY] == read_pod(changed, cache.names, cache.requests)
    assert (KEY in cache.state.placements) is kept


@pytest.mark.parametrize("end, reason", [
    pytest.param(_phase("Succeeded"), ENDED_FINISHED, id="succeeded"),
    pytest.param(_phase("Failed"), ENDED_FINISHED, id="failed"),
    pytest.param(_cleared, ENDED_CLEARED, id="assignment-cleared"),
])
def test_an_end_after_status_updates_releases_the_booking(end: Change, reason: str) -> None:
    cache, raw = _booked()
    for version in ("3", "4"):
        cache.upsert_pod(_updated(raw, _running, version=version))
    cache.upsert_pod(_updated(raw, end, version="5"))
    assert KEY not in cache.state.placements
    assert dict(cache.released_bookings) == {reason: 1}


def test_a_deletion_after_status_updates_releases_the_booking() -> None:
    cache, raw = _booked()
    cache.upsert_pod(_updated(raw, _running, version="3"))
    cache.remove_pod(_updated(raw, _running, version="4"))
    assert KEY not in cache.state.placements and KEY not in cache.pods
    assert dict(cache.released_bookings) == {ENDED_DELETED: 1}


def test_a_pending_pods_confirmation_after_status_updates_is_read() -> None:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("N1", [16276])])
    raw = placed_pod("a", "N1", 0, 8138)
    cache.upsert_pod(raw)
    cache.upsert_pod(_updated(raw, _running, version="3"))
    cache.upsert_pod(_updated(raw, _running, _annotation("gpupool.io/allocated-v1", CONFIRMED), version="4"))
    assert cache.pods[KEY].allocated and cache.bookings[KEY].stage is Stage.CONFIRMED


NAMES = ResourceNames()


@pytest.mark.parametrize("change", [
    pytest.param(_running, id="running"),
    pytest.param(lambda r: r["metadata"].pop("managedFields", None), id="managed-fields-only"),
    pytest.param(lambda r: None, id="version-only"),
    pytest.param(_phase("Pending"), id="pending-again"),
])
def test_what_is_carried_over_is_what_reading_gives(change: Change) -> None:
    raw = placed_pod("a", "N1", 0, 8138)
    earlier = read_pod(raw, NAMES)
    new = _updated(raw, change)
    carried = carried_over(earlier, new)
    assert carried is not None and carried == read_pod(new, NAMES)


def test_a_finished_pods_later_status_updates_are_carried_over_finished() -> None:
    raw = placed_pod("a", "N1", 0, 8138)
    raw["status"] = {"phase": "Succeeded"}
    earlier = read_pod(raw, NAMES)
    assert earlier is not None and earlier.finished
    new = _updated(raw, _phase("Failed"))
    assert carried_over(earlier, new) == read_pod(new, NAMES)


def test_a_record_without_its_object_is_read_again() -> None:
    """A CPU-only pod's record keeps no object (:class:`PodRecord`'s ``raw``): nothing to compare with."""
    raw = pod("c", container(cpu="1"), node_name="N1")
    earlier = read_pod(raw, NAMES)
    assert earlier is not None and earlier.raw is None
    assert carried_over(earlier, _updated(raw, _running)) is None


@pytest.mark.parametrize("broken", [
    pytest.param(lambda r: r.__setitem__("metadata", "x"), id="metadata-not-an-object"),
    pytest.param(lambda r: r.__setitem__("spec", None), id="no-spec"),
    pytest.param(lambda r: r.__setitem__("status", ["Running"]), id="status-not-an-object"),
    pytest.param(lambda r: r["metadata"].pop("namespace"), id="namespace-dropped"),
])
def test_an_object_of_another_shape_is_read_again(broken: Change) -> None:
    raw = placed_pod("a", "N1", 0, 8138)
    earlier = read_pod(raw, NAMES)
    assert carried_over(earlier, _updated(raw, broken)) is None


def test_the_key_looked_up_is_the_records_for_the_same_pod() -> None:
    raw = placed_pod("a", "N1", 0, 8138)
    record = read_pod(raw, NAMES)
    assert record is not None and listed_key(raw) == record.key
    assert listed_key({"metadata": {"name": "a"}}) == "default/a"
    assert listed_key({"metadata": None}) is None
