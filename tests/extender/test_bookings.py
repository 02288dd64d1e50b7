"""The booking life cycle: the table's transitions, what a stage holds, and how a pod object is read."""

from __future__ import annotations

import pytest

from gpupool.api.annotations import decode_assignment
from gpupool.api.names import ResourceNames
from gpupool.core.model import Placement
from gpupool.extender.bookings import (
    HOLDING,
    IDLE,
    TRANSITIONS,
    Booking,
    BookingError,
    Event,
    Pin,
    Stage,
    advance,
    next_stage,
    observe,
)
from gpupool.extender.pod_records import read_pod
from gpupool.kube.pod_holding import PodRecord
from gpupool.kube.translate import node_spec
from tests.kube.builders import container, node, placed_pod, pod

NOW = 1_000_000.0
SPECS = {"n1": node_spec(node("n1", [16276, 16276]), ResourceNames())}
CARDS = Placement("default/p", "n1", 0, 0)
OTHER = Placement("default/p", "n1", 500, 0)


def record(raw: dict[str, object]) -> PodRecord:
    found = read_pod(raw, ResourceNames())
    assert found is not None
    return found


def seen(raw: dict[str, object] | None, pin: Pin | None = None, now: float = NOW) -> Event:
    return observe(record(raw) if raw is not None else None, pin, now=now, unconfirmed_timeout_s=60,
                   spec_of=SPECS.get).event


@pytest.mark.parametrize(("path", "end"), [
    pytest.param([Event.RESERVE, Event.COMMIT, Event.SEEN_BOUND, Event.SEEN_CONFIRMED], Stage.CONFIRMED,
                 id="bind-then-confirmed"),
    pytest.param([Event.RESERVE, Event.ROLLBACK], Stage.ROLLED_BACK, id="bind-failed"),
    pytest.param([Event.RESERVE, Event.COMMIT, Event.TIMED_OUT], Stage.EXPIRED, id="pin-never-seen"),
    pytest.param([Event.SEEN_ANNOTATED, Event.TIMED_OUT], Stage.EXPIRED, id="annotated-never-bound"),
    pytest.param([Event.SEEN_BOUND, Event.SEEN_NOTHING], Stage.RELEASED, id="bound-then-deleted"),
    pytest.param([Event.RESERVE, Event.SEEN_NOTHING, Event.SEEN_BOUND], Stage.RESERVED,
                 id="a-bind-in-flight-ignores-the-watch"),
    pytest.param([Event.RESERVE, Event.COMMIT, Event.SEEN_BEHIND], Stage.PINNED, id="watch-behind-the-pin"),
    pytest.param([Event.SEEN_BOUND, Event.RESERVE, Event.ROLLBACK, Event.SEEN_BOUND], Stage.BOUND,
                 id="a-retried-bind-rolls-back-to-what-the-api-says"),
    pytest.param([Event.COMMIT], Stage.PINNED, id="a-commit-whose-reservation-was-lost-still-holds"),
    pytest.param([Event.SEEN_UNKNOWN_NODE, Event.SEEN_BOUND], Stage.BOUND, id="waiting-for-the-node"),
    pytest.param([Event.TIMED_OUT], Stage.EXPIRED, id="already-expired-when-first-seen"),
])
def test_paths_through_the_table(path: list[Event], end: Stage) -> None:
    stage = Stage.NONE
    for event in path:
        stage = next_stage(stage, event)
    assert stage == end


@pytest.mark.parametrize(("stage", "event"), [
    pytest.param(Stage.NONE, Event.ROLLBACK, id="rollback-without-reservation"),
    pytest.param(Stage.BOUND, Event.ROLLBACK, id="rollback-of-a-bound-pod"),
    pytest.param(Stage.BOUND, Event.TIMED_OUT, id="a-bound-pod-never-times-out"),
    pytest.param(Stage.CONFIRMED, Event.SEEN_BEHIND, id="behind-a-pin-after-the-watch-decided"),
])
def test_a_transition_not_in_the_table_is_an_error(stage: Stage, event: Event) -> None:
    with pytest.raises(BookingError, match=f"stage {stage.value} cannot take event {event.value}"):
        advance(Booking(stage), event)


def test_every_stage_takes_a_reservation_and_every_holding_stage_can_end() -> None:
    assert all((stage, Event.RESERVE) in TRANSITIONS for stage in Stage)
    for stage in HOLDING - {Stage.RESERVED, Stage.ASSUMED}:
        assert TRANSITIONS[(stage, Event.SEEN_NOTHING)] in IDLE
    assert TRANSITIONS[(Stage.ASSUMED, Event.UNASSUME)] in IDLE  # a pending pod's assumption ends only so


def test_an_assumption_holds_against_a_pending_pod_and_yields_to_a_bind_or_the_api() -> None:
    """The watch shows an assumed pod pending (it holds nothing in the API yet): the filter's choice
    stays. A bind takes it over; a pod bound or annotated by a writer is what the API says."""
    assumed = advance(Booking(), Event.ASSUME, CARDS)
    assert assumed == Booking(Stage.ASSUMED, CARDS)
    assert advance(assumed, Event.SEEN_NOTHING) is assumed
    assert advance(assumed, Event.TIMED_OUT) is assumed  # an expired assignment of an earlier attempt
    assert advance(assumed, Event.ASSUME, OTHER) == Booking(Stage.ASSUMED, OTHER)
    assert advance(assumed, Event.RESERVE, OTHER) == Booking(Stage.RESERVED, OTHER)
    assert advance(assumed, Event.SEEN_BOUND, OTHER) == Booking(Stage.BOUND, OTHER)
    assert advance(assumed, Event.UNASSUME) == Booking(Stage.NONE)


@pytest.mark.parametrize("stage", sorted(HOLDING - {Stage.ASSUMED}))
def test_a_pod_that_holds_something_is_not_assumed(stage: Stage) -> None:
    """A bind in flight or a written assignment stands; the filter's choice does not replace it."""
    with pytest.raises(BookingError):
        advance(Booking(stage, CARDS), Event.ASSUME, OTHER)


def test_a_reservation_keeps_its_placement_against_the_watch_and_idle_stages_hold_nothing() -> None:
    reserved = advance(Booking(), Event.RESERVE, CARDS)
    assert advance(reserved, Event.SEEN_BOUND, OTHER) is reserved
    assert advance(reserved, Event.COMMIT, OTHER) == Booking(Stage.PINNED, OTHER)
    assert advance(reserved, Event.ROLLBACK, OTHER) == Booking(Stage.ROLLED_BACK)


def assigned(name: str, *, bound: bool = True, when: float = NOW) -> dict[str, object]:
    return placed_pod(name, "n1", 0, 4000, bound=bound, when=when)


def test_pod_objects_are_read_into_events() -> None:
    assert seen(None) == Event.SEEN_NOTHING
    assert seen(pod("pending", container(mib=1000))) == Event.SEEN_NOTHING
    assert seen(pod("cpu", container(cpu="2"), node_name="n1")) == Event.SEEN_BOUND
    assert seen(pod("far", container(cpu="2"), node_name="n9")) == Event.SEEN_UNKNOWN_NODE
    assert seen(assigned("a", bound=False)) == Event.SEEN_ANNOTATED
    assert seen(assigned("a", bound=False, when=NOW - 61)) == Event.TIMED_OUT
    assert seen(assigned("a")) == Event.SEEN_BOUND
    done = assigned("a")
    done["status"] = {"phase": "Succeeded"}
    assert seen(done) == Event.SEEN_NOTHING


@pytest.mark.parametrize("assignment", [
    pytest.param("{", id="garbage"),
    pytest.param('{"v":1,"node":"n1","time":"2024-05-01T10:00:00Z","containers":[{"name":"main","init":false,'
                 '"cards":[{"index":7,"uuid":"GPU-n1-7","memoryMiB":4000,"computeMilli":0,"exclusive":false}]}]}',
                 id="a-card-the-node-does-not-have"),
])
def test_a_bound_pod_with_an_unreadable_assignment_is_seen_as_such(assignment: str) -> None:
    raw = pod("p", container(mib=4000, cpu="1"), node_name="n1",
              annotations={"gpupool.io/assignment-v1": assignment})
    found = observe(record(raw), None, now=NOW, unconfirmed_timeout_s=60, spec_of=SPECS.get)
    assert found.event == Event.SEEN_UNREADABLE and found.problem
    assert found.placement == Placement("default/p", "n1", 1000, 0)  # CPU and memory still count
    unbound = pod("q", container(mib=4000), annotations={"gpupool.io/assignment-v1": assignment})
    assert seen(unbound) == Event.SEEN_NOTHING  # not bound: the next bind writes a new one


def test_a_pin_holds_until_the_watch_shows_its_assignment_or_its_deadline_passes() -> None:
    written = assigned("p")
    text = written["metadata"]["annotations"]["gpupool.io/assignment-v1"]  # type: ignore[index]
    pin = Pin(CARDS, decode_assignment(text), deadline=NOW + 120)
    older = pod("p", container(mib=4000))  # an event from before the write
    assert seen(older, pin) == Event.SEEN_BEHIND
    assert seen(older, pin, now=NOW + 121) == Event.TIMED_OUT
    assert seen(written, pin) == Event.SEEN_BOUND
    # no object: a pod the watch has not delivered yet (the cache forgets a deleted pod's pin first)
    assert seen(None, pin) == Event.SEEN_BEHIND
    assert seen(None, pin, now=NOW + 121) == Event.TIMED_OUT
    finished = assigned("p")
    finished["status"] = {"phase": "Succeeded"}
    assert seen(finished, pin) == Event.SEEN_NOTHING  # ended: the pin has nothing left to hold


def test_a_bound_assignment_holds_its_cards_and_the_pods_cpu_and_memory() -> None:
    raw = assigned("p")
    raw["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2", "memory": "1Gi"}  # type: ignore[index]
    found = observe(record(raw), None, now=NOW, unconfirmed_timeout_s=60, spec_of=SPECS.get)
    assert found.event == Event.SEEN_BOUND and found.placement is not None
    assert (found.placement.cpu_milli, found.placement.memory_mib) == (2000, 1024)
    assert found.placement.held_per_card() == {0: (4000, 0, False)}
