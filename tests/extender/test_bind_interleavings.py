"""Orders of filters, binds, writes and watch events that could let two pods' bookings on one card
exceed it, in the extender's ledger or in the assignments it writes (issue 28).

Why: once, in a CI run, the GPU pod e2e's ``with-init`` pod was refused at the node agent's Allocate:
its assignment put 20 % of card 1 beside 90 % the other pods' assignments held there. Every order
below is played exactly (one thread; another pod's steps run inside a write, the watch runs when
told: tests/extender/interleaving_world.py). Two of them wrote such assignments before the fix,
both when kube-scheduler binds a pod again whose first write was applied:

* the first write's answer was lost, or the apiserver answered it with a server error after
  applying it (etcd's "request timed out" is a 500 after the write was proposed): the bind rolled
  its reservation back on a server error, so the pod's cards looked free while the pod held them;
* a bind sent again (after such an error, or after kube-scheduler gave up on a bind that then
  succeeded) read the watch's older copy of the pod, lifted the cards the first bind wrote and
  chose others; until its own Binding was refused (409, bound already), another pod's bind was
  given the written cards.

The others hold, and are kept as regression tests: an assumption that lapses or yields before its
bind, a watch event older than the bind's write, a watch event that arrives before the bind's
answer, and the e2e's own pods through random orders of all of these.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from gpupool.extender.binder import Binder
from gpupool.extender.bookings import PIN_SECONDS, Stage
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import DEFAULT_ASSUME_S, ExtenderSettings
from gpupool.kube.translate import pod_request
from gpupool.testing.fake_api import FakePodApi
from tests.extender.binder_world import WRITES
from tests.extender.interleaving_world import (
    APPLIED,
    DROPPED,
    LOST,
    NAMES,
    NODE,
    ScriptedApi,
    World,
    gpu_pod_e2e_pods,
    refused,
    server_error,
)
from tests.extender.test_remote_share_bind import on_switch
from tests.kube.builders import container, node, placed_pod, pod

GIB = 1024


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def lost_answer(one_write: bool) -> list[str]:
    """The outcomes of a bind's writes whose Binding is applied and its answer lost."""
    return [LOST] if one_write else [APPLIED, LOST]


def stage(world: World, name: str) -> Stage | None:
    booking = world.cache.bookings.get(f"default/{name}")
    return booking.stage if booking is not None else None


# ------------------------------------------------------------------ a bind sent again (fixed)
def four_pods_on_two_cards(one_write: bool) -> World:
    """x (8 GiB) is bound to card 0 with its answer lost, then v (6 GiB) joins it and w (7 GiB) takes
    card 1: decided afresh without x, binpack would now put x on card 1 (the fuller), and y (10 GiB)
    would fit card 0 where x is written."""
    world = World.make(cards=2, one_write=one_write)
    for name, gib in (("x", 8), ("v", 6), ("w", 7), ("y", 10)):
        world.create(pod(name, container(mib=gib * GIB)))
    world.watch.deliver()
    for outcome in lost_answer(one_write):
        world.api.script("x", outcome)
    assert "stay booked" in world.bind("x").error
    assert world.bind("v").ok and world.bind("w").ok
    assert world.free_mib() == [2 * GIB, 9 * GIB]
    return world


@pytest.mark.parametrize("one_write", WRITES)
def test_a_bind_sent_again_after_a_lost_answer_takes_the_written_cards_again(one_write: bool) -> None:
    world = four_pods_on_two_cards(one_write)
    seen: list[list[int]] = []
    y_result: list[Any] = []

    def y_binds_meanwhile() -> None:
        seen.append(world.free_mib())
        y_result.append(world.bind("y"))

    world.api.script("x", before=y_binds_meanwhile)  # the resent bind's first write
    assert world.bind("x").ok  # x is bound already, where it was asked: a success
    assert seen == [[2 * GIB, 9 * GIB]]  # x's written cards stayed booked during the resent bind
    assert "does not fit" in y_result[0].error
    assert world.over_committed() == {}
    world.watch.deliver()
    assert world.cache.conflicts == {} and stage(world, "x") is Stage.BOUND
    assert world.free_mib() == [2 * GIB, 9 * GIB]


@pytest.mark.parametrize("one_write", WRITES)
def test_a_bind_sent_again_after_a_write_that_never_arrived_writes_the_same_cards(one_write: bool) -> None:
    """The first write got no answer and was not applied: the resent bind writes the cards its pin
    holds, so whichever write had landed, the ledger held what it names."""
    world = four_pods_on_two_cards_dropped(one_write)
    pinned = world.cache.state.placements["default/x"]
    assert world.bind("x").ok
    assert world.cache.state.placements["default/x"] == pinned
    world.watch.deliver()
    assert stage(world, "x") is Stage.BOUND and world.over_committed() == {}
    assert "does not fit" in world.bind("y").error


def four_pods_on_two_cards_dropped(one_write: bool) -> World:
    world = World.make(cards=2, one_write=one_write)
    for name, gib in (("x", 8), ("v", 6), ("w", 7), ("y", 10)):
        world.create(pod(name, container(mib=gib * GIB)))
    world.watch.deliver()
    for outcome in ([DROPPED] if one_write else [APPLIED, DROPPED]):
        world.api.script("x", outcome)
    assert "stay booked" in world.bind("x").error
    assert world.bind("v").ok and world.bind("w").ok
    return world


def test_a_resent_bind_that_read_an_older_copy_than_the_watch_shows_reads_the_api() -> None:
    """The resent bind took the watch's copy of the pod (pending) just before the watch showed it
    bound: the bound cards are not lifted, the API is read and the pod answered as bound."""
    world = World.make(cards=2)
    for name, gib in (("x", 8), ("v", 6), ("w", 7), ("y", 10)):
        world.create(pod(name, container(mib=gib * GIB)))
    world.watch.deliver()
    older = world.cache.pod_object("default/x")
    assert world.bind("x").ok and world.bind("v").ok and world.bind("w").ok
    world.watch.deliver()
    assert stage(world, "x") is Stage.BOUND
    read = world.cache.pod_object
    world.cache.pod_object = lambda key: older if key == "default/x" else read(key)  # type: ignore[method-assign]
    writes = len(world.api.writes)
    assert world.bind("x").ok
    assert len(world.api.writes) == writes  # nothing written: the API showed the pod bound
    assert "does not fit" in world.bind("y").error
    assert world.over_committed() == {}


def test_a_resent_write_without_answer_ends_its_pin_when_the_watch_shows_the_first_write() -> None:
    """kube-scheduler gave up on a bind that succeeded and sent it again; the resent bind writes the
    same cards and gets no answer: the watch showing the first write shows those cards held."""
    world = World.make(cards=1)
    world.create(pod("x", container(mib=10 * GIB)))
    world.watch.deliver()
    assert world.bind("x").ok
    world.api.script("x", DROPPED)
    assert "stay booked" in world.bind("x").error
    world.watch.deliver()
    assert stage(world, "x") is Stage.BOUND and "default/x" not in world.cache.keeper.pins
    assert world.free_mib() == [6 * GIB]


def test_a_bind_to_another_node_waits_while_an_earlier_write_may_land() -> None:
    """The first bind's write got no answer and the pod is not bound: a bind to another node is
    refused (the write may still land) until the watch shows the outcome or the pin runs out."""
    clock = Clock()
    world = World.make(cards=1, nodes=("n1", "n2"), clock=clock)
    for name in ("x", "y"):
        world.create(pod(name, container(mib=10 * GIB)))
    world.watch.deliver()
    world.api.script("x", DROPPED)
    assert "stay booked" in world.bind("x", "n1").error
    elsewhere = world.bind("x", "n2")
    assert "wrote its assignment for node n1" in elsewhere.error and "has not shown yet" in elsewhere.error
    assert world.free_mib("n1") == [6 * GIB] and world.free_mib("n2") == [16 * GIB]
    assert "does not fit" in world.bind("y", "n1").error
    clock.now += PIN_SECONDS + 1
    world.cache.expire()
    assert world.bind("x", "n2").ok and world.bind("y", "n1").ok
    assert world.over_committed() == {}


def test_a_pod_whose_write_got_no_answer_is_filtered_to_its_pinned_node_and_bound_there_at_once() -> None:
    """The write was not applied: kube-scheduler retries the pod, whose filter would count its own
    pinned cards against it (one card, room for one copy); it passes the pinned node instead."""
    world = World.make(cards=1, nodes=("n1", "n2"))
    world.create(pod("x", container(mib=10 * GIB)))
    world.create(placed_pod("owner", "n2", 0, 10 * GIB))  # n2 full: x fits n1 only
    world.watch.deliver()
    world.api.script("x", DROPPED)
    assert "stay booked" in world.bind("x", "n1").error
    obj = world.fake.get_pod("default", "x")
    outcome = world.service.filter(pod_request(obj, world.cache.names), ["n1", "n2"], pod=obj)
    assert outcome.passed == ["n1"] and "has not shown yet" in outcome.failed["n2"]
    assert world.bind("x", "n1").ok
    world.watch.deliver()
    assert stage(world, "x") is Stage.BOUND and world.free_mib("n1") == [6 * GIB]


def test_a_replacement_pod_is_not_steered_by_its_predecessors_pin() -> None:
    world = World.make(cards=1, nodes=("n1", "n2"))
    world.create(pod("x", container(mib=10 * GIB)))
    world.api.script("x", DROPPED)
    assert "stay booked" in world.bind("x", "n1").error
    replacement = pod("x", container(mib=10 * GIB), uid="uid-replacement")
    outcome = world.service.filter(pod_request(replacement, world.cache.names), ["n1", "n2"], pod=replacement)
    assert outcome.passed == ["n2"]  # n1's card is held by the pin; the pin is not the replacement's


def test_a_remote_share_sent_again_after_a_lost_answer_keeps_its_server_cards() -> None:
    """A remote share's placement is on its server node, its Binding names the client node: the
    resent bind to that client node writes the same server card; another client node waits."""
    fake = FakePodApi()
    api = ScriptedApi(fake)
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([on_switch(node("near", [16 * GIB]), "s1"), on_switch(node("cpu"), "s1"),
                         on_switch(node("cpu2"), "s1")])
    cache.replace_pods([])
    binder = Binder(cache, api)
    fake.create_pod(pod("p", container(mib=10 * GIB, cpu="1"), annotations={"gpupool.io/remote-gpu": "true"}))
    api.script("p", DROPPED)
    assert "stay booked" in binder.bind("default", "p", "uid-default-p", "cpu").error
    assert [u.memory_free for u in cache.state.card_usage("near")] == [6 * GIB]
    assert "wrote its assignment for node cpu" in binder.bind("default", "p", "uid-default-p", "cpu2").error
    assert binder.bind("default", "p", "uid-default-p", "cpu").ok
    assert [u.memory_free for u in cache.state.card_usage("near")] == [6 * GIB]
    assert fake.get_pod("default", "p")["spec"]["nodeName"] == "cpu"


# ------------------------------------------------------------- a server error after the write (fixed)
@pytest.mark.parametrize("status", [500, 502, 504])
@pytest.mark.parametrize("one_write", WRITES)
def test_a_write_answered_with_a_server_error_keeps_its_cards_booked(one_write: bool, status: int) -> None:
    world = World.make(cards=1, one_write=one_write)
    for name in ("x", "y"):
        world.create(pod(name, container(mib=10 * GIB)))
    world.watch.deliver()
    for outcome in ([server_error(status)] if one_write else [APPLIED, server_error(status)]):
        world.api.script("x", outcome)
    result = world.bind("x")
    assert f"HTTP {status}" in result.error and "stay booked" in result.error
    assert world.free_mib() == [6 * GIB]
    assert "does not fit" in world.bind("y").error
    assert world.over_committed() == {}
    world.watch.deliver()
    assert stage(world, "x") is Stage.BOUND and world.cache.conflicts == {}


def test_an_assignment_patch_answered_with_a_server_error_keeps_its_cards_booked() -> None:
    world = World.make(cards=1, one_write=False)
    for name in ("x", "y"):
        world.create(pod(name, container(mib=10 * GIB)))
    world.watch.deliver()
    world.api.script("x", server_error(500))
    assert "stay booked" in world.bind("x").error
    assert "does not fit" in world.bind("y").error
    assert world.over_committed(bound_only=False) == {}


@pytest.mark.parametrize("status", [403, 422, 429, 503])
@pytest.mark.parametrize("one_write", WRITES)
def test_a_write_the_apiserver_refused_gives_its_cards_back(one_write: bool, status: int) -> None:
    world = World.make(cards=1, one_write=one_write)
    for name in ("x", "y"):
        world.create(pod(name, container(mib=10 * GIB)))
    world.watch.deliver()
    for outcome in ([refused(status)] if one_write else [APPLIED, refused(status)]):
        world.api.script("x", outcome)
    result = world.bind("x")
    assert f"HTTP {status}" in result.error and "stay booked" not in result.error
    assert world.free_mib() == [16 * GIB]
    assert world.bind("y").ok
    assert world.over_committed(bound_only=False) == {}


# ------------------------------------------------------------------------- orders that hold
def test_an_assumption_that_lapses_before_its_bind_never_shares_a_card() -> None:
    """kube-scheduler's bind came after the assumption's deadline and another pod's filter took the
    card meanwhile: the late bind decides from the ledger, which holds the other pod's assumption."""
    clock = Clock()
    world = World.make(cards=1, clock=clock)
    for name in ("x", "y"):
        world.create(pod(name, container(mib=10 * GIB)))
    world.watch.deliver()
    assert world.filter("x") == [NODE]
    clock.now += DEFAULT_ASSUME_S + 0.1
    assert world.filter("y") == [NODE]  # x's assumption lapsed; y's holds the card now
    assert "does not fit" in world.bind("x").error
    assert world.bind("y").ok
    assert world.over_committed(bound_only=False) == {}


def test_a_reservation_outlives_every_deadline_while_its_write_is_in_flight() -> None:
    """Housekeeping runs while x's write stalls past the assumption's and the pin's deadlines: the
    reservation holds, and y's filter and bind meanwhile find the card taken."""
    clock = Clock()
    world = World.make(cards=1, clock=clock)
    for name in ("x", "y"):
        world.create(pod(name, container(mib=10 * GIB)))
    world.watch.deliver()
    assert world.filter("x") == [NODE]
    seen: list[object] = []

    def stalled() -> None:
        clock.now += PIN_SECONDS + DEFAULT_ASSUME_S
        world.cache.expire()
        seen.extend([stage(world, "x"), world.filter("y"), world.bind("y").ok])

    world.api.script("x", before=stalled)
    assert world.bind("x").ok
    assert seen == [Stage.RESERVED, [], False]
    assert world.over_committed(bound_only=False) == {}


def test_an_assumption_that_yields_to_a_claim_is_decided_again_at_its_bind() -> None:
    """x's filter assumed card 0; another writer's pod z is then seen bound there (a claim of the
    cluster): the assumption yields and x's bind takes the other card."""
    world = World.make(cards=2)
    world.create(pod("x", container(mib=10 * GIB)))
    world.watch.deliver()
    assert world.filter("x") == [NODE]
    assumed = world.cache.state.placements["default/x"].held_per_card()
    [card] = assumed
    world.create(placed_pod("z", NODE, card, 10 * GIB))
    world.watch.deliver()
    assert stage(world, "x") in (None, Stage.NONE) and world.cache.conflicts == {}
    assert world.bind("x").ok
    assert set(world.cache.state.placements["default/x"].held_per_card()) == {1 - card}
    assert world.over_committed() == {}


@pytest.mark.parametrize("one_write", WRITES)
def test_an_event_older_than_the_bind_keeps_the_written_cards(one_write: bool) -> None:
    """The watch delivers the pod's creation (pending, no assignment) after its bind committed:
    the pin holds the cards until the watch shows the write."""
    world = World.make(cards=1, one_write=one_write)
    for name in ("x", "y"):
        world.create(pod(name, container(mib=10 * GIB)))
    assert world.bind("x").ok  # read from the API: the watch has shown nothing yet
    world.watch.deliver(2)  # x and y created, pending
    assert stage(world, "x") is Stage.PINNED and world.free_mib() == [6 * GIB]
    assert "does not fit" in world.bind("y").error
    world.watch.deliver()
    assert stage(world, "x") is Stage.BOUND and world.free_mib() == [6 * GIB]


def test_the_watch_showing_the_pod_bound_before_the_binds_answer_keeps_one_booking() -> None:
    world = World.make(cards=1)
    for name in ("x", "y"):
        world.create(pod(name, container(mib=10 * GIB)))
    world.watch.deliver()
    stages: list[Stage | None] = []

    def watch_first() -> None:
        world.watch.deliver()
        stages.append(stage(world, "x"))
        assert "does not fit" in world.bind("y").error

    world.api.script("x", after=watch_first)
    assert world.bind("x").ok
    assert stages == [Stage.RESERVED] and stage(world, "x") is Stage.BOUND
    assert world.free_mib() == [6 * GIB] and world.over_committed() == {}


# ----------------------------------------------------------------- the GPU pod e2e's own pods
E2E_SLICES = ["shared", "multi", "span-a", "span-b", "gpushare", "with-init"]


def test_the_gpu_pod_e2e_pods_in_order_land_where_the_e2e_expects() -> None:
    """Filter and bind one after the other, the watch up to date: whole on card 0, the slices
    packed on card 1 up to 90 %, with-init (both its containers) on card 2."""
    world = World.make(cards=3)
    for obj in gpu_pod_e2e_pods().values():
        world.create(obj)
    world.watch.deliver()
    for name in ["whole", *E2E_SLICES]:
        assert world.filter(name) == [NODE]
        assert world.bind(name).ok
        world.watch.deliver()
    cards = {name: set(world.cache.state.placements[f"default/{name}"].held_per_card())
             for name in ["whole", *E2E_SLICES]}
    assert cards["whole"] == {0} and cards["with-init"] == {2}
    assert world.written()[(NODE, 1)] == ((4 + 3 + 2 + 2 + 2) * GIB, 900)
    assert world.over_committed() == {}


def test_the_gpu_pod_e2e_pods_bound_before_the_extenders_watch_delivered_them_keep_their_cards() -> None:
    """The CI failure's shape: the six pods are created at once and kube-scheduler's informer sees
    them before the extender's watch does; each is filtered (the extender reads the pod from the
    request) and bound (the binder reads it from the API). Before the fix each bind's commit read
    the missing watch record as a deleted pod and freed the cards at once, so every slice was packed
    on card 1 and with-init's 20 % came beside the 90 % of shared, multi, span-a and span-b."""
    world = World.make(cards=3)
    pods = gpu_pod_e2e_pods()
    world.create(pods["whole"])
    world.watch.deliver()
    assert world.filter("whole") == [NODE] and world.bind("whole").ok
    world.watch.deliver()
    for name in E2E_SLICES:
        world.create(pods[name])
    for name in E2E_SLICES:  # the extender's watch delivers nothing meanwhile
        assert world.filter(name) == [NODE]
        assert world.bind(name).ok, name
        assert world.over_committed() == {}, (name, world.written())
    assert set(world.cache.state.placements["default/with-init"].held_per_card()) == {2}
    world.watch.deliver()
    assert world.cache.conflicts == {}
    assert all(stage(world, name) is Stage.BOUND for name in E2E_SLICES)
    assert world.written()[(NODE, 1)] == ((4 + 3 + 2 + 2 + 2) * GIB, 900)


def test_a_pod_bound_before_the_watch_delivered_it_keeps_its_cards_until_the_watch_does() -> None:
    world = World.make(cards=1)
    for name in ("x", "y"):
        world.create(pod(name, container(mib=10 * GIB)))
    assert world.bind("x").ok  # read from the API: the watch has shown nothing yet
    assert stage(world, "x") is Stage.PINNED and world.free_mib() == [6 * GIB]
    assert "does not fit" in world.bind("y").error
    world.watch.deliver()
    assert stage(world, "x") is Stage.BOUND and world.free_mib() == [6 * GIB]


@pytest.mark.parametrize("delivered", [False, True], ids=["deleted-unseen", "deleted-after-creation"])
def test_a_pinned_pod_deleted_frees_its_cards(delivered: bool) -> None:
    """The watch's DELETED event ends the pin (a pod the watch never showed bound included)."""
    world = World.make(cards=1)
    for name in ("x", "y"):
        world.create(pod(name, container(mib=10 * GIB)))
    assert world.bind("x").ok
    if delivered:
        world.watch.deliver(1)  # x created, pending: still pinned
        assert stage(world, "x") is Stage.PINNED
    world.fake.delete_pod("default", "x")
    world.watch.deliver()
    assert world.free_mib() == [16 * GIB] and "default/x" not in world.cache.keeper.pins
    assert world.bind("y").ok


def test_the_deletion_of_an_earlier_pod_of_the_name_keeps_the_replacements_pin() -> None:
    """x was created, deleted and created again before the watch delivered any of it; the binder
    read the replacement from the API and bound it. The watch's late deletion of the first x must
    not free the replacement's cards."""
    world = World.make(cards=1)
    world.create(pod("x", container(mib=2 * GIB), uid="uid-first-x"))
    world.fake.delete_pod("default", "x")
    world.create(pod("x", container(mib=10 * GIB)))
    world.create(pod("y", container(mib=10 * GIB)))
    assert world.bind("x").ok
    for _ in range(3):  # the first x created and deleted, the replacement created
        world.watch.deliver(1)
        assert world.free_mib() == [6 * GIB], world.cache.bookings.get("default/x")
    world.watch.deliver()
    assert stage(world, "x") is Stage.BOUND and world.free_mib() == [6 * GIB]
    assert "does not fit" in world.bind("y").error


OUTCOMES = [APPLIED] * 6 + [LOST, DROPPED, server_error(500), refused(503)]
"""A Binding's outcome in the random orders: mostly applied and answered, sometimes not."""


def play(seed: int) -> World:
    """The e2e's six slice pods, created at once, scheduled as kube-scheduler would in a random order
    of its steps: filters in queue order, each passed pod's bind any time later, during which other
    steps may run (another pod's filter or bind, the watch); a bind's write applied or not and
    answered or not; a bind answered too late for kube-scheduler (it retries the pod, a filter and
    a bind again) unless its informer has seen the pod bound. Returns the world at the end."""
    rng = random.Random(seed)
    world = World.make(cards=3)
    pods = gpu_pod_e2e_pods()
    world.create(pods["whole"])
    world.watch.deliver()
    assert world.filter("whole") == [NODE] and world.bind("whole").ok
    world.watch.deliver()
    for name in E2E_SLICES:
        world.create(pods[name])
    queue = list(E2E_SLICES)
    passed: list[str] = []  # filtered, bind not sent yet
    binding: set[str] = set()

    def informer_saw_bound(name: str) -> bool:
        key = f"default/{name}"
        record = world.cache.pods.get(key)
        return record is not None and bool(record.node_name)

    def filter_next() -> None:
        name = queue.pop(0)
        if informer_saw_bound(name):
            return
        if world.filter(name) == [NODE]:
            passed.append(name)
        else:
            queue.append(name)  # kube-scheduler retries it after an event

    def bind_one(depth: int) -> None:
        name = passed.pop(rng.randrange(len(passed)))
        binding.add(name)
        outcome = rng.choice(OUTCOMES)
        during = (lambda: step(depth + 1)) if depth < 2 and rng.random() < 0.6 else None
        world.api.clear(name)
        world.api.script(name, outcome, before=during if rng.random() < 0.5 else None,
                         after=during if rng.random() < 0.5 else None)
        result = world.bind(name)
        binding.discard(name)
        late = rng.random() < 0.1
        if not result.ok or late:
            queue.append(name)  # kube-scheduler schedules it again: a filter, then a bind

    def step(depth: int = 0) -> None:
        choices = []
        if queue:
            choices.append("filter")
        if passed:
            choices.append("bind")
        if world.watch.events:
            choices.append("watch")
        if not choices:
            return
        choice = rng.choice(choices)
        if choice == "filter":
            filter_next()
        elif choice == "bind":
            bind_one(depth)
        else:
            world.watch.deliver(rng.randint(1, len(world.watch.events)))
        assert world.over_committed() == {}, (seed, world.written())

    for _ in range(300):
        if not (queue or passed or world.watch.events):
            break
        step()
    world.watch.deliver()
    return world


@pytest.mark.parametrize("seed", range(120))
def test_the_gpu_pod_e2e_pods_in_random_orders_never_over_commit_a_card(seed: int) -> None:
    world = play(seed)
    assert world.over_committed() == {}
    assert world.cache.conflicts == {}
    bound = {obj["metadata"]["name"] for obj in world.fake.list_pods() if obj["spec"].get("nodeName")}
    assert {"whole", *E2E_SLICES} >= bound
    for name in bound:  # every bound pod holds what its assignment names, once
        text = world.fake.get_pod("default", name)["metadata"]["annotations"][NAMES.assignment]
        assert text and stage(world, name) in (Stage.BOUND, Stage.CONFIRMED), name


def test_the_settings_these_orders_run_with_are_the_shipped_ones() -> None:
    assert World.make().service.settings == ExtenderSettings()
