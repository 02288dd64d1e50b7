"""Node agent liveness: a node whose agent Lease lapsed gets no GPU pods, with the reason, until renewed."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpupool.api.agent_lease import LEASE_COMPONENT, LEASE_LABEL, lease_name
from gpupool.extender.cache import ClusterCache
from gpupool.extender.liveness import AgentLiveness
from gpupool.extender.service import BindResult, ExtenderService
from gpupool.kube.translate import pod_request
from tests.extender.lease_fakes import FakeClock
from tests.extender.modes import EVERY_FIT
from tests.kube.builders import container, node, placed_pod, pod

CARD = 16276
NODES = ("n1", "n2", "n3")


def lease(node_name: str, renewed: dt.datetime, duration: int = 40) -> dict[str, Any]:
    return {"metadata": {"name": lease_name(node_name), "labels": {LEASE_LABEL: LEASE_COMPONENT}},
            "spec": {"holderIdentity": node_name, "leaseDurationSeconds": duration,
                     "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}


class World:
    def __init__(self, *, require: bool = False) -> None:
        self.clock = FakeClock()
        self.cache = ClusterCache(policy="binpack")
        self.cache.replace_nodes([node(n, [CARD]) for n in NODES])
        self.cache.replace_pods([])
        self.liveness = AgentLiveness("kube-system", require=require, ledger_lock=self.cache.lock,
                                      monotonic=self.clock.monotonic, wall=self.clock.wall)
        # every node that fits passes (not the shipped mode), so the answer shows each refusal
        self.service = ExtenderService(self.cache, Binder(), node_gate=self.liveness.refusals, settings=EVERY_FIT)
        self.request = pod_request(pod("p", container(mib=4000)), self.cache.names)

    def renew(self, *nodes: str) -> None:
        for n in nodes:
            self.liveness.apply("MODIFIED", lease(n, self.clock.wall()))

    def filter(self) -> tuple[list[str], dict[str, str]]:
        outcome = self.service.filter(self.request, list(NODES))
        return outcome.passed, outcome.failed


class Binder:
    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        return BindResult()


def test_a_lapsed_lease_refuses_the_node_with_its_age_and_a_renewal_brings_it_back() -> None:
    world = World()
    world.liveness.replace([lease(n, world.clock.wall()) for n in NODES])
    world.clock.advance(30)
    world.renew("n2", "n3")
    assert world.filter() == (list(NODES), {})
    world.clock.advance(33)  # n1 last renewed 63 s ago; the others 33 s ago
    passed, failed = world.filter()
    assert passed == ["n2", "n3"]
    assert failed["n1"].startswith("node agent on n1 last renewed 63 s ago (lease 40 s)")
    assert "not running" in failed["n1"]
    assert world.service.bind("default", "p", "uid", "n1").error == failed["n1"]
    assert world.service.bind("default", "p", "uid", "n2").ok
    world.renew("n1")
    assert world.filter() == (list(NODES), {})


def test_prioritize_does_not_reuse_a_filter_made_before_a_lapse() -> None:
    """The memo of the last filter must not hide a refusal: prioritize then scores the lapsed node 0."""
    world = World()
    world.liveness.replace([lease(n, world.clock.wall()) for n in NODES])
    world.filter()
    world.clock.advance(41)
    world.renew("n2", "n3")
    scores, error = world.service.prioritize(world.request, list(NODES))
    assert error == "" and scores.as_dict()["n1"] == 0


def test_preempt_skips_a_node_whose_agent_lapsed() -> None:
    world = World()
    world.cache.replace_pods([placed_pod("x", "n1", 0, CARD), placed_pod("y", "n2", 0, CARD)])
    world.liveness.replace([lease(n, world.clock.wall()) for n in NODES])
    world.clock.advance(50)
    world.renew("n2")
    victims = {"n1": ["uid-default-x"], "n2": ["uid-default-y"]}
    kept, error = world.service.preempt(world.request, victims)
    assert error == "" and kept == {"n2": ["uid-default-y"]}


@pytest.mark.parametrize(("require", "refused"), [
    pytest.param(False, set(), id="not-required-nodes-without-lease-pass"),
    pytest.param(True, {"n3"}, id="required-nodes-without-lease-refused"),
])
def test_a_node_that_never_had_a_lease(require: bool, refused: set[str]) -> None:
    world = World(require=require)
    world.liveness.replace([lease(n, world.clock.wall()) for n in ("n1", "n2")])
    _, failed = world.filter()
    assert set(failed) == refused
    if require:
        assert "no gpupool node agent lease (kube-system/gpupool-agent-n3)" in failed["n3"]
        world.renew("n3")
        assert world.filter()[1] == {}


def test_before_the_lease_watch_lists_nothing_is_refused() -> None:
    """Fail open: an extender whose lease watch cannot list (RBAC not updated yet) schedules as before."""
    world = World(require=True)
    assert world.filter() == (list(NODES), {})


def test_a_first_sighting_of_an_old_lease_is_not_trusted_for_a_whole_duration() -> None:
    """An extender (re)started next to an agent that died long ago refuses the node at once; a Lease
    whose renewTime is in our future counts as just renewed."""
    world = World()
    now = world.clock.wall()
    world.liveness.replace([lease("n1", now - dt.timedelta(minutes=10)), lease("n2", now + dt.timedelta(minutes=5)),
                            lease("n3", now)])
    passed, failed = world.filter()
    assert passed == ["n2", "n3"] and "last renewed 600 s ago" in failed["n1"]


def test_a_relist_keeps_observation_times_and_forgets_deleted_leases() -> None:
    world = World(require=True)
    first = [lease(n, world.clock.wall()) for n in NODES]
    world.liveness.replace(first)
    world.clock.advance(30)
    world.liveness.replace(first)  # same renewTimes: not renewals
    world.clock.advance(11)
    assert set(world.filter()[1]) == set(NODES)
    world.renew(*NODES)
    world.liveness.apply("DELETED", lease("n2", world.clock.wall()))
    failed = world.filter()[1]
    assert set(failed) == {"n2"} and "no gpupool node agent lease" in failed["n2"]


@pytest.mark.parametrize("spec", [
    pytest.param({"leaseDurationSeconds": 40, "renewTime": "2024-01-01T00:00:00Z"}, id="no-holder"),
    pytest.param({"holderIdentity": "n1", "leaseDurationSeconds": 40}, id="no-renew-time"),
    pytest.param({"holderIdentity": "n1", "renewTime": "2024-01-01T00:00:00Z"}, id="no-duration"),
    pytest.param({"holderIdentity": "n1", "leaseDurationSeconds": True, "renewTime": "x"}, id="bool-duration"),
    pytest.param({"holderIdentity": "n1", "leaseDurationSeconds": 0, "renewTime": "x"}, id="zero-duration"),
])
def test_a_malformed_lease_is_ignored_not_fatal(spec: dict[str, Any]) -> None:
    world = World()
    world.liveness.replace([{"metadata": {"name": "gpupool-agent-n1"}, "spec": spec}])
    world.liveness.apply("MODIFIED", {"metadata": {"name": "x"}, "spec": spec})
    assert world.filter() == (list(NODES), {})


def test_an_unreadable_renew_time_counts_as_just_renewed() -> None:
    world = World()
    world.liveness.replace([{"spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40, "renewTime": "soon"}}])
    world.clock.advance(39)
    assert world.filter()[1] == {}
    world.clock.advance(2)
    assert set(world.filter()[1]) == {"n1"}


def test_no_lapse_costs_no_walk_over_the_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    """Filter's hot path: with nothing lapsed, a call looks at the deadline heap's head only."""
    world = World()
    world.liveness.replace([lease(n, world.clock.wall()) for n in NODES])
    world.filter()

    def walked(*_: Any) -> str:
        raise AssertionError("a reason was written for a node that did not lapse")

    monkeypatch.setattr(world.liveness, "_lapse_reason", walked)
    for _ in range(3):
        assert world.liveness.refusals(world.cache.state) == {}


def test_long_node_names_get_a_bounded_lease_name() -> None:
    long = "n" * 253
    name = lease_name(long)
    assert len(name) == 253 and name != lease_name("n" * 252 + "m")
    assert lease_name("gpu-7") == "gpupool-agent-gpu-7"
