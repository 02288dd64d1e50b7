"""Binds of one pod in flight together: a re-sent bind must never free the first one's cards.

kube-scheduler sends a bind again once the first passed its timeout, and the first may still be
running (the apiserver stalled). Until the extender's watch shows the first bind's assignment, the
ledger is the only thing that keeps its card taken: a third pod must never land on that card.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.testing.fake_api import FakePodApi
from tests.extender.bind_fakes import BindInThread, LaggingWatch, StallingApi
from tests.extender.binder_world import WRITES, free_mib, usage_from_annotations
from tests.kube.builders import container, node, pod

CARD_MIB = 16276
POD_MIB = 12000
"""Two pods of this size do not fit on one card together."""
WATCH_BEHIND_S = 60.0
"""A watch lag longer than any test: the cache sees a change only when the test flushes the watch."""
SERIALISED_GRACE_S = 0.3
"""How long the test lets a re-sent bind run before it checks the first one (a bind that waits for
the first never reaches the stalled read)."""


@dataclass
class RaceWorld:
    api: FakePodApi
    stalls: StallingApi
    cache: ClusterCache
    binder: Binder
    watch: LaggingWatch

    def create(self, name: str) -> dict[str, Any]:
        return self.api.create_pod(pod(name, container(mib=POD_MIB)))

    def bindings_of(self, name: str) -> int:
        """Bindings of ``name`` the API accepted."""
        return self.stalls.bound.count(name)

    @property
    def assignment_write(self) -> str:
        """The verb of the call that writes the assignment (a stall there holds the bind mid-write)."""
        return "bind" if self.binder.annotate_in_binding else "patch"


WorldFactory = Callable[..., RaceWorld]


@contextmanager
def race_worlds() -> Iterator[WorldFactory]:
    """Make worlds (``make(lag_s, latency_s=0.0, one_write=True)``): one card of ``CARD_MIB`` on
    node ``n1``; the watches are stopped on exit."""
    watches: list[LaggingWatch] = []

    def make(lag_s: float, latency_s: float = 0.0, one_write: bool = True) -> RaceWorld:
        api = FakePodApi(latency_s=latency_s)
        cache = ClusterCache(policy="binpack")
        cache.replace_nodes([node("n1", [CARD_MIB])])
        cache.replace_pods([])
        stalls = StallingApi(api)
        watch = LaggingWatch(api, cache, lag_s)
        watches.append(watch)
        return RaceWorld(api, stalls, cache, Binder(cache, stalls, annotate_in_binding=one_write), watch)

    try:
        yield make
    finally:
        for watch in watches:
            watch.close()


@pytest.fixture
def race_world() -> Iterator[WorldFactory]:
    with race_worlds() as make:
        yield make


def assert_one_pod_on_the_card(world: RaceWorld) -> None:
    world.watch.flush()
    assert usage_from_annotations(world.api) == {("n1", 0): POD_MIB}
    assert free_mib(world.cache, "n1") == [CARD_MIB - POD_MIB]


def test_a_resent_bind_waits_for_the_first_and_no_third_pod_lands_on_its_card(race_world: WorldFactory) -> None:
    """The first bind has written the assignment and its Binding hangs; the re-sent bind (its read
    of the pod hangs too, were it to read) must not free the card: once the first has bound, a third
    pod asking the same space is refused although the watch shows nothing yet."""
    world = race_world(WATCH_BEHIND_S)
    p, q = world.create("p"), world.create("q")
    world.watch.flush()
    first_binding = world.stalls.hold("bind", "p")
    resent_read = world.stalls.hold("get", "p")
    first = BindInThread(world.binder, p, "n1")
    assert first_binding.entered.wait(5)
    resent = BindInThread(world.binder, p, "n1")
    resent_read.entered.wait(SERIALISED_GRACE_S)
    first_binding.release()
    assert first.join().ok

    third = world.binder.bind("default", "q", q["metadata"]["uid"], "n1")
    resent_read.release()
    second = resent.join()

    assert not third.ok and "does not fit" in third.error, third
    assert second.ok and second.placement == first.join().placement
    assert world.bindings_of("p") == 1 and world.bindings_of("q") == 0
    assert_one_pod_on_the_card(world)


@pytest.mark.parametrize("one_write", WRITES)
def test_a_bind_resent_after_the_first_finished_books_nothing_twice(race_world: WorldFactory, one_write: bool) -> None:
    """The watch has not shown the first bind yet: the re-sent bind's write is refused (409), it
    reads the pod, finds it bound to the node it asks for and succeeds; the card stays taken."""
    world = race_world(WATCH_BEHIND_S, one_write=one_write)
    p, q = world.create("p"), world.create("q")
    world.watch.flush()
    first = world.binder.bind("default", "p", p["metadata"]["uid"], "n1")
    again = world.binder.bind("default", "p", p["metadata"]["uid"], "n1")
    assert first.ok and again.ok, again
    assert free_mib(world.cache, "n1") == [CARD_MIB - POD_MIB]
    assert not world.binder.bind("default", "q", q["metadata"]["uid"], "n1").ok
    assert world.bindings_of("p") == 1
    assert_one_pod_on_the_card(world)


@pytest.mark.slow
@pytest.mark.parametrize("one_write", WRITES)
def test_a_resent_bind_to_another_node_waits_and_is_refused(race_world: WorldFactory, one_write: bool) -> None:
    world = race_world(WATCH_BEHIND_S, one_write=one_write)
    world.cache.upsert_node(node("n2", [CARD_MIB]))
    p = world.create("p")
    world.watch.flush()
    first_patch = world.stalls.hold(world.assignment_write, "p")
    first = BindInThread(world.binder, p, "n1")
    assert first_patch.entered.wait(5)
    elsewhere = BindInThread(world.binder, p, "n2")
    time.sleep(SERIALISED_GRACE_S)
    assert elsewhere.result is None  # still waiting for the first
    first_patch.release()
    assert first.join().ok
    refused = elsewhere.join()
    assert "already bound to node n1" in refused.error
    assert world.bindings_of("p") == 1
    assert free_mib(world.cache, "n2") == [CARD_MIB]


@pytest.mark.parametrize("one_write", WRITES)
def test_a_resent_bind_waits_no_longer_than_its_deadline(race_world: WorldFactory, one_write: bool) -> None:
    """The first bind hangs on its write: the re-sent one answers an error once its own deadline has
    passed, having written and booked nothing; the first then completes."""
    world = race_world(WATCH_BEHIND_S, one_write=one_write)
    p = world.create("p")
    world.watch.flush()
    first_patch = world.stalls.hold(world.assignment_write, "p")
    first = BindInThread(world.binder, p, "n1")
    assert first_patch.entered.wait(5)
    world.binder.deadline_s = 0.2  # for binds that start from now on
    started = time.monotonic()
    late = world.binder.bind("default", "p", p["metadata"]["uid"], "n1")
    waited = time.monotonic() - started
    assert "still in progress" in late.error and late.attempts == 0
    assert 0.15 <= waited < 2.0
    assert world.cache.in_flight() == 1  # the first bind's reservation, untouched
    first_patch.release()
    assert first.join().ok
    assert world.bindings_of("p") == 1
    assert_one_pod_on_the_card(world)


RACE_ROUNDS = 3
FIRST_BINDING_STALL_S = 0.3
"""The apiserver hangs on the first bind's Binding and on the re-sent bind's read this long."""
RESEND_AFTER_S = 0.02
THIRD_POD_EVERY_S = 0.005


@dataclass(frozen=True)
class RoundOutcome:
    third_pod_bound: bool
    first_pod_bound: bool
    over_committed: bool


def race_round(make: WorldFactory, lag_s: float, one_write: bool = True) -> RoundOutcome:
    """One round of the reliability probe: a bind of ``p`` whose Binding hangs, the same bind sent
    again shortly after (its read of the pod hangs too), and a third pod ``q`` tried on the same
    card again and again while both are in flight; the watch runs ``lag_s`` behind the API."""
    world = make(lag_s, latency_s=0.001, one_write=one_write)
    p, q = world.create("p"), world.create("q")
    world.watch.flush()
    world.stalls.hold("bind", "p", FIRST_BINDING_STALL_S)
    world.stalls.hold("get", "p", FIRST_BINDING_STALL_S)
    first = BindInThread(world.binder, p, "n1")
    time.sleep(RESEND_AFTER_S)
    resent = BindInThread(world.binder, p, "n1")
    third_bound = threading.Event()
    until = time.monotonic() + FIRST_BINDING_STALL_S + RESEND_AFTER_S
    while time.monotonic() < until and not third_bound.is_set():
        if world.binder.bind("default", "q", q["metadata"]["uid"], "n1").ok:
            third_bound.set()
        time.sleep(THIRD_POD_EVERY_S)
    first.join()
    resent.join()
    world.watch.flush()
    used = usage_from_annotations(world.api)
    bound = {x["metadata"]["name"] for x in world.api.list_pods() if x["spec"].get("nodeName")}
    return RoundOutcome(third_pod_bound=third_bound.is_set(), first_pod_bound="p" in bound,
                        over_committed=any(v > CARD_MIB for v in used.values()))


@pytest.mark.slow
@pytest.mark.parametrize("lag_s", [pytest.param(0.05, id="watch-50ms-behind"),
                                   pytest.param(0.2, id="watch-200ms-behind")])
@pytest.mark.parametrize("one_write", WRITES)
def test_no_third_pod_lands_while_two_binds_of_one_pod_are_in_flight(race_world: WorldFactory, lag_s: float,
                                                                     one_write: bool) -> None:
    for _ in range(RACE_ROUNDS):
        outcome = race_round(race_world, lag_s, one_write)
        assert outcome == RoundOutcome(third_pod_bound=False, first_pod_bound=True, over_committed=False)


def probe(rounds: int, lag_s: float) -> dict[str, int]:
    """How many of ``rounds`` rounds put the third pod on the card and over-committed it (the
    numbers docs/extender.md quotes)."""
    with race_worlds() as make:
        outcomes = [race_round(make, lag_s) for _ in range(rounds)]
    return {"rounds": rounds, "third_pod_landed": sum(o.third_pod_bound for o in outcomes),
            "over_committed": sum(o.over_committed for o in outcomes)}
