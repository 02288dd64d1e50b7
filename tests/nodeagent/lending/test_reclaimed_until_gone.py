"""A pod whose reclaim finished counts as reclaimed until it leaves the node (issue 26).

An evicted pod stays listed until kubelet has stopped it and it is deleted (a bare pod stays
``Failed`` until someone deletes it). Meanwhile the monitor may still show its process holding the
card (a stale state file, or a container kubelet restarted), and the rules met it again: beside its
returned owner it was reclaimed a second time (a second ``SIGUSR1``, a second eviction and a second
``GpuReclaimed`` event), by the owner's next open (rule 1), its own open (rule 3), the kernel gate's
refusals at each step, or a restarted agent's judgement of the borrowers. Now the rules count it as
being reclaimed until the pod watch no longer lists it, across a restart too: its opens are refused,
its holds bar no one (the owner keeps its card), and the loan its owner ended stays ended.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool.nodeagent.lending.pods import LendingPods
from gpupool.nodeagent.lending.reclaim_journal import JOURNAL_FILE
from gpupool.nodeagent.lending.rules import Rule
from gpupool.nodeagent.monitor.events import Verdict
from gpupool.nodeagent.monitor.usage_state import DeviceState
from tests.nodeagent.lending.support import LEND, decoded, holder, pod_json
from tests.nodeagent.lending.test_open_refusals import gated
from tests.nodeagent.lending.world import CARD0, PODS, Api, World, idle_owner, open_, run, settle

BORROWER = ("ns", "borrower")


class Recording(Api):
    """The API, counting the ``GpuReclaimed`` events too."""

    def __init__(self) -> None:
        super().__init__()
        self.warned: list[tuple[str, str, str]] = []

    async def warn(self, namespace: str, name: str, reason: str, message: str) -> None:
        self.warned.append((namespace, name, reason))


def reclaimed_once(world: World, api: Recording) -> None:
    assert api.evicted == [BORROWER]
    assert api.warned == [("ns", "borrower", "GpuReclaimed")]
    assert [s for _, s in world.processes.sent].count("SIGUSR1") == 1


@pytest.mark.parametrize("meets", ["owner-opens-again", "its-restarted-container-opens", "kernel-gate-step",
                                   "agent-restarted"])
def test_a_reclaimed_pod_still_on_the_node_is_never_reclaimed_twice_and_its_owner_keeps_the_card(
        tmp_path: Path, meets: str) -> None:
    world = World(tmp_path, PODS)
    api = world.api = Recording()
    gate = gated(world)[0] if meets == "kernel-gate-step" else None

    async def body() -> None:
        service = world.started(gate=gate)
        idle_owner(world)
        await service.step()
        assert set(service.loans) == {0}
        world.processes.alive = {200: "id-borrower"}
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
        assert service.decide(open_(101)) is Verdict.ALLOW  # the owner is back: the borrower is reclaimed
        await settle(service)
        reclaimed_once(world, api)
        # still listed (the eviction has not landed), and still seen holding the card beside its busy owner
        world.processes.alive = {250: "id-borrower"}
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 250), state=DeviceState.BUSY)
        if meets == "owner-opens-again":
            assert service.decide(open_(102)) is Verdict.ALLOW  # the borrower's hold bars nothing
        elif meets == "its-restarted-container-opens":
            assert service.decide(open_(250)) is Verdict.DENY
            assert service.decisions[-1][1].rule is Rule.RECLAIM_IN_FLIGHT
        elif meets == "agent-restarted":
            service = world.started()  # a fresh agent on the same files judges the borrowers still holding
        await service.step()
        await service.step()
        await settle(service)
        reclaimed_once(world, api)
        assert 0 not in service.loans and service.reclaiming == frozenset()
        if gate is not None:
            assert service.refusals() == {"id-borrower": {CARD0}}  # its opens stay refused meanwhile

    run(body)


def test_once_it_left_the_node_a_new_pod_of_the_same_name_is_judged_afresh(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)
    api = world.api = Recording()

    async def body() -> None:
        service = world.started()
        world.processes.alive = {200: "id-borrower"}
        world.monitor.hold(CARD0, holder("owner", 100))  # busy: not lent
        assert service.decide(open_(200)) is Verdict.DENY  # rule 3: the borrower is reclaimed
        await settle(service)
        reclaimed_once(world, api)
        again = pod_json("borrower", borrowed_from="ns/owner", cards=(0,))
        again["metadata"]["uid"] = "uid-borrower-2"
        world.pods.on_list(decoded(*[p for p in PODS if p["metadata"]["name"] != "borrower"], again))
        await service.step()
        assert json.loads((tmp_path / JOURNAL_FILE).read_text())["reclaimed"] == []
        world.processes.alive = {201: "id-borrower"}
        assert service.decide(open_(201)) is Verdict.DENY
        await settle(service)
        assert api.evicted == [BORROWER, BORROWER]  # another pod: reclaimed as any other

    run(body)


def test_a_restarted_agent_refuses_a_reclaimed_pods_starts_until_a_full_list_lacks_it(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        first = world.started()
        world.processes.alive = {200: "id-borrower"}
        world.monitor.hold(CARD0, holder("owner", 100))
        assert first.decide(open_(200)) is Verdict.DENY
        await settle(first)
        assert first.start_refusal(BORROWER, "uid-borrower") is not None
        world.pods = LendingPods(LEND)  # the restarted agent's pod watch has not listed yet
        second = world.started()
        await second.step()
        refusal = second.start_refusal(BORROWER, "uid-borrower")
        assert refusal is not None and "was reclaimed" in refusal and "GpuReclaimed" in refusal
        assert second.start_refusal(BORROWER, "uid-of-another-pod") is None
        world.pods.on_list(decoded(*PODS))  # listed: still on the node
        await second.step()
        assert second.start_refusal(BORROWER, "uid-borrower") is not None
        world.pods.on_list(decoded(*[p for p in PODS if p["metadata"]["name"] != "borrower"]))
        await second.step()  # the first full list without it: it left the node
        assert second.start_refusal(BORROWER, "uid-borrower") is None
        assert world.started().start_refusal(BORROWER, "uid-borrower") is None  # and a third life agrees

    run(body)


@pytest.mark.parametrize("content", [
    pytest.param('{"version": 1, "reclaims": [], "reclaimed": {"ns": "x"}}', id="not-a-list"),
    pytest.param('{"version": 1, "reclaims": [], "reclaimed": [{"namespace": "ns", "pod": "borrower"}, 7, '
                 '{"namespace": "ns", "pod": "borrower1", "uid": "uid-borrower1"}]}', id="bad-entries"),
])
def test_an_unreadable_reclaimed_entry_is_logged_and_dropped_never_a_crash_nor_an_unreadable_journal(
        tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / JOURNAL_FILE).write_text(content)
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        load = service.journal.load()
        assert load.unreadable == "" and load.records == ()
        expected = {("ns", "borrower1"): "uid-borrower1"} if "borrower1" in content else {}
        assert service.journal.reclaimed() == expected

    run(body)
    assert any("reclaim journal" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
