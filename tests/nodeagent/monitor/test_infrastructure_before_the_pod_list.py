"""Infrastructure pods before the pod watch has listed (issue 26): where a namespace is listed in
``--infrastructure-namespaces``, a pod's holder recorded before the agent's first list of its pods is
undecided (neither use nor judged: no risk finding, its card not lent) and judged once the list is
in; a watch that never lists ends the wait after a deadline, with a warning, and the holders are
ordinary from then on. Where no namespace is listed nothing changes: a tenant is held at once.

The monitor is the agent's (:class:`UsageMonitor`, so the wait is wired as the agent wires it) on a
scripted source and process table; the resolver reads a fake /proc; the pods reach the directory
through :class:`DirectoryFeed`, as the pod cache hands them over.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpupool.core.model import CardSlice
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.containers.pod_containers import DirectoryFeed
from gpupool.nodeagent.monitor.container_resolver import ContainerResolver
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind
from gpupool.nodeagent.monitor.pod_list_wait import PodListWait
from gpupool.nodeagent.monitor.service import MonitorConfig, UsageMonitor
from gpupool.nodeagent.monitor.source_selector import SourceChoice
from gpupool.nodeagent.monitor.state_codec import StateFileError, decode_state, encode_state
from gpupool.nodeagent.monitor.state_file import StateFile
from gpupool.nodeagent.monitor.usage_sampling import CardUsage, ProcessUsage, UsageSample
from gpupool.nodeagent.monitor.usage_state import DeviceState, DeviceUsage, Holder, UsageState
from gpupool.nodeagent.node_pod import decode_node_pod
from gpupool.nodeagent.risk.detector import NodeView, detect
from gpupool.nodeagent.risk.findings import RiskKind
from tests.nodeagent.monitor.fake_processes import FakeProcesses
from tests.nodeagent.monitor.scripted_source import ScriptedSource
from tests.nodeagent.monitor.test_infrastructure_namespaces import (
    EXPORTER,
    EXPORTER_PID,
    NAMES,
    OPERATOR,
    TRAIN,
    TRAIN_PID,
    cid,
    fake_proc,
    pod_json,
)

GPU0, GPU1 = "/dev/nvidia0", "/dev/nvidia1"
CARDS = {GPU0: 0, GPU1: 1}
WAIT_S = 60.0
VALIDATOR = pod_json("cuda-validator", OPERATOR, limits={"nvidia.com/gpu": "1"})
"""A pod in the listed namespace that asked NVIDIA's device plugin for a card: a tenant of it."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


STARTED: list[World] = []


class World:
    """The agent's monitor at its start: the exporter holds card 0, a tenant card 1, the watch has
    not listed."""

    def __init__(self, tmp_path: Path, namespaces: tuple[str, ...] = (OPERATOR,)) -> None:
        self.clock = Clock()
        self.processes = FakeProcesses()
        self.processes.spawn(EXPORTER_PID, GPU0)
        self.processes.spawn(TRAIN_PID, GPU1)
        self.directory = InMemoryContainerDirectory()
        self.state_path = tmp_path / "state.json"
        resolver = ContainerResolver(self.directory, fake_proc(tmp_path),
                                     infrastructure_namespaces=frozenset(namespaces))

        def choose(paths: Sequence[str]) -> SourceChoice:
            return SourceChoice(ScriptedSource(), "scripted for the test")

        def sample() -> UsageSample:
            return UsageSample(self.clock(), (CardUsage(0, 0, 300, 16384), CardUsage(1, 0, 300, 16384)))

        sampler = type("Sampler", (), {"sample": staticmethod(sample)})()
        config = MonitorConfig(str(self.state_path), 600.0, infrastructure_namespaces=namespaces,
                               pod_list_wait_s=WAIT_S)
        self.monitor = UsageMonitor("n1", CARDS, (), sampler, config, directory=self.directory, choose=choose,
                                    processes=self.processes, identify=resolver, clock=self.clock,
                                    ignore_pids=())  # a scripted pid may be this process's own
        STARTED.append(self)

    def list_pods(self, *pods: dict[str, Any]) -> None:
        """The pod watch's first list."""
        DirectoryFeed(self.directory).on_list([r for r in (decode_node_pod(p, NAMES) for p in pods) if r is not None])

    def device(self, path: str) -> DeviceUsage:
        device = self.monitor.state.device(path)
        assert device is not None
        return device

    def findings(self) -> list[tuple[RiskKind, str]]:
        """The risk checks on the monitor's holders now (no grant anywhere: a tenant holding a card
        gpupool granted it nothing is ``ungranted-card``)."""
        view = NodeView(CARDS, self.monitor.state, None, {}, False, None, self.clock.now + 3600)
        return [(r.kind, r.pod) for r in detect(view)]


def restored(tmp_path: Path, *holders: tuple[str, Holder]) -> None:
    """A state file a previous agent (which listed no namespace) left."""
    devices = tuple(DeviceUsage(path, (holder,), 1.0, DeviceState.BUSY) for path, holder in holders)
    StateFile(tmp_path / "state.json").write(UsageState("n1", 2.0, devices))


def pod_holder(pid: int, pod: dict[str, Any]) -> Holder:
    meta = pod["metadata"]
    return Holder(pid=pid, start_time=1000, since=1.0, container_id=cid(meta["name"]), container="main",
                  pod=meta["name"], namespace=meta["namespace"])


@pytest.fixture(autouse=True)
def _stop_monitors() -> Iterator[None]:
    """Every monitor a test started is stopped (its state writer's thread ends)."""
    yield
    for world in STARTED:
        world.monitor.stop()
    STARTED.clear()


def test_before_the_list_the_pods_holders_are_undecided_then_judged_once_it_is_in(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.monitor.start()
    for path in (GPU0, GPU1):  # the restart's scan: both found, neither can be told yet
        device = world.device(path)
        assert [h.undecided for h in device.holders] == [True]
        assert (device.state, device.users) == (DeviceState.FREE, ())
    world.monitor.recorder.identify_again()  # still no list: still undecided
    assert all(world.device(p).holders[0].undecided for p in (GPU0, GPU1))
    world.list_pods(EXPORTER, TRAIN)
    world.monitor.recorder.identify_again()
    exporter, tenant = world.device(GPU0).holders[0], world.device(GPU1).holders[0]
    assert (exporter.pod, exporter.infrastructure, exporter.undecided) == ("dcgm-exporter", OPERATOR, False)
    assert (tenant.pod, tenant.infrastructure, tenant.undecided) == ("train", "", False)
    assert (world.device(GPU0).state, world.device(GPU1).state) == (DeviceState.FREE, DeviceState.BUSY)
    assert world.findings() == [(RiskKind.UNGRANTED_CARD, "train")]  # the tenant is judged now
    world.monitor.stop()  # the writer's queue flushed
    assert StateFile(world.state_path).load() == world.monitor.state  # written, and readable again


def test_an_open_before_the_list_is_undecided_but_counts_as_use(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.processes.exit(TRAIN_PID)
    world.monitor.start()
    world.processes.spawn(TRAIN_PID, GPU1)
    world.monitor.recorder.on_event(DeviceEvent(EventKind.OPEN, GPU1, TRAIN_PID, 1005.0))
    device = world.device(GPU1)
    assert (device.holders[0].undecided, device.state, device.last_use) == (True, DeviceState.FREE, 1005.0)
    world.list_pods(EXPORTER, TRAIN)
    world.monitor.recorder.identify_again()
    assert (world.device(GPU1).state, world.device(GPU1).users[0].pod) == (DeviceState.BUSY, "train")


def test_where_no_namespace_is_listed_a_tenant_is_held_at_once(tmp_path: Path) -> None:
    world = World(tmp_path, namespaces=())
    world.monitor.start()
    device = world.device(GPU1)
    assert (device.holders[0].undecided, device.state) == (False, DeviceState.BUSY)


def test_a_watch_that_never_lists_ends_the_wait_and_the_holders_are_ordinary(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    world = World(tmp_path)
    world.monitor.start()
    world.clock.now += WAIT_S - 1
    world.monitor.recorder.identify_again()
    assert world.device(GPU1).holders[0].undecided
    world.clock.now += 1
    with caplog.at_level(logging.WARNING, logger="gpupool.nodeagent.monitor.pod_list_wait"):
        world.monitor.recorder.identify_again()
        world.monitor.recorder.identify_again()
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "the pod watch has not listed this node's pods 60 s after the start"]
    for path in (GPU0, GPU1):  # unnamed ordinary holders: held (and not lent), as before the setting
        device = world.device(path)
        assert (device.holders[0].undecided, device.state) == (False, DeviceState.BUSY)
    world.list_pods(EXPORTER, TRAIN)  # a late list still names them, and judges them
    world.monitor.recorder.identify_again()
    assert (world.device(GPU0).state, world.device(GPU0).holders[0].infrastructure) == (DeviceState.FREE, OPERATOR)
    assert world.device(GPU1).users[0].pod == "train"


@pytest.mark.parametrize(("pod", "finding"), [
    pytest.param(EXPORTER, [], id="infrastructure"),
    pytest.param(VALIDATOR, [(RiskKind.UNGRANTED_CARD, "cuda-validator")], id="asked-nvidia-for-a-gpu"),
])
def test_a_restored_holder_in_a_listed_namespace_is_not_judged_until_the_list_is_in(
        tmp_path: Path, pod: dict[str, Any], finding: list[tuple[RiskKind, str]]) -> None:
    """A previous agent listed no namespace, so it recorded the exporter as an ordinary holder; the
    restart lists gpu-operator. The tenant's restored holder (a namespace not listed) is judged at once."""
    restored(tmp_path, (GPU0, pod_holder(EXPORTER_PID, pod)), (GPU1, pod_holder(TRAIN_PID, TRAIN)))
    world = World(tmp_path)
    world.monitor.start()
    undecided, tenant = world.device(GPU0).holders[0], world.device(GPU1).holders[0]
    assert (undecided.undecided, undecided.infrastructure, world.device(GPU0).state) == (True, "", DeviceState.FREE)
    assert (tenant.undecided, world.device(GPU1).state) == (False, DeviceState.BUSY)
    assert world.findings() == [(RiskKind.UNGRANTED_CARD, "train")]  # not the undecided one
    world.list_pods(pod, TRAIN)
    world.monitor.recorder.identify_again()
    assert not world.device(GPU0).holders[0].undecided
    assert world.findings() == sorted([*finding, (RiskKind.UNGRANTED_CARD, "train")])


def test_the_wait_asks_only_for_listed_namespaces_and_ends_at_the_first_list() -> None:
    listed, clock = [False], Clock()
    wait = PodListWait(lambda: listed[0], frozenset({OPERATOR}), deadline_s=10, clock=clock)
    assert (wait(""), wait(OPERATOR), wait("ml")) == (True, True, False)
    listed[0] = True
    assert (wait(""), wait(OPERATOR)) == (False, False)
    assert not PodListWait(lambda: False, frozenset(), clock=clock)("")  # nothing can be infrastructure
    with pytest.raises(ValueError, match="negative"):
        PodListWait(lambda: False, frozenset({OPERATOR}), deadline_s=-1)


def test_the_state_file_round_trips_an_undecided_holder_and_refuses_one_in_no_container() -> None:
    holder = Holder(pid=7, start_time=70, since=1.0, container_id=cid("x"), undecided=True)
    state = UsageState("n1", 2.0, (DeviceUsage(GPU0, (holder,), None, DeviceState.FREE),))
    encoded = encode_state(state)
    assert b'"undecided":true' in encoded and decode_state(encoded) == state
    assert b"undecided" not in encode_state(UsageState("n1", 2.0, (DeviceUsage(GPU0),)))
    with pytest.raises(StateFileError, match="in no container"):
        decode_state(encoded.replace(f'"containerId":"{cid("x")}"'.encode(), b'"containerId":""'))
    with pytest.raises(StateFileError, match="true or false"):
        decode_state(encoded.replace(b'"undecided":true', b'"undecided":1'))


def test_the_risk_checks_count_no_memory_of_an_undecided_holder() -> None:
    """The same holder over its grant is a finding once decided, none while undecided."""
    sample = UsageSample(4999.0, (CardUsage(0, 0, 16000, 16384, (ProcessUsage(7, 16000),)),))
    grants = {("ns", "p", "main"): {0: CardSlice(0, 256, 0)}}
    found = {}
    for undecided in (False, True):
        holder = Holder(pid=7, start_time=70, since=1.0, container_id="c", container="main", pod="p",
                        namespace="ns", undecided=undecided)
        state = UsageState("n1", 2.0, (DeviceUsage(GPU0, (holder,), None, DeviceState.BUSY),))
        found[undecided] = [r.kind for r in detect(NodeView({GPU0: 0}, state, sample, grants, False, None, 5000.0))]
    assert found == {False: [RiskKind.OVER_MEMORY], True: []}
