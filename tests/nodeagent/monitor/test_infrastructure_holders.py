"""Infrastructure holders (issues 26/27): host daemons that keep device files open do not make a card held.

The resolver reads a fake /proc (cgroup file, exe link); the recorder and the idle rule run on a
scripted process table.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.monitor.container_resolver import ContainerResolver
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind
from gpupool.nodeagent.monitor.idle import IdleDetector
from gpupool.nodeagent.monitor.recorder import UsageRecorder
from gpupool.nodeagent.monitor.service import DEFAULT_INFRASTRUCTURE_HOLDERS, MonitorConfig
from gpupool.nodeagent.monitor.state_codec import StateFileError, decode_state, encode_state
from gpupool.nodeagent.monitor.state_file import StateFile
from gpupool.nodeagent.monitor.usage_sampling import CardUsage, UsageSample
from gpupool.nodeagent.monitor.usage_state import DeviceState, DeviceUsage, Holder, ProcessIdentity, UsageState
from tests.nodeagent.monitor.fake_processes import FakeProcesses

GPU0 = "/dev/nvidia0"
UID = "0f8d4c2e-2b1a-4c3d-9e8f-112233445566"
CID = "a" * 64
HOST_CGROUP = "0::/system.slice/nvidia-persistenced.service\n"
POD_CGROUP = f"0::/kubepods/burstable/pod{UID}/{CID}\n"
INFRA = frozenset(DEFAULT_INFRASTRUCTURE_HOLDERS)


def fake_proc(tmp_path: Path, pid: int, cgroup: str, exe: str) -> str:
    """A /proc with one process: its cgroup file and its exe link (to a path that need not exist)."""
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(cgroup)
    os.symlink(exe, proc / str(pid) / "exe")
    return str(proc)


def resolver(proc: str, infrastructure: frozenset[str] = INFRA) -> ContainerResolver:
    directory = InMemoryContainerDirectory()
    directory.add(UID, "ml", "train", {"main": f"containerd://{CID}"})
    return ContainerResolver(directory, proc, infrastructure=infrastructure)


@pytest.mark.parametrize(("cgroup", "exe", "expected"), [
    pytest.param(HOST_CGROUP, "/usr/bin/nvidia-persistenced", ProcessIdentity(infrastructure="nvidia-persistenced"),
                 id="host-persistenced"),
    pytest.param("0::/system.slice/nvidia-dcgm.service\n", "/usr/bin/nv-hostengine",
                 ProcessIdentity(infrastructure="nv-hostengine"), id="host-dcgm"),
    pytest.param(HOST_CGROUP, "/usr/bin/nvidia-persistenced (deleted)",
                 ProcessIdentity(infrastructure="nvidia-persistenced"), id="binary-replaced-by-an-upgrade"),
    pytest.param("0::/user.slice/session-3.scope\n", "/usr/bin/python3.11", ProcessIdentity(),
                 id="host-process-not-listed"),
    pytest.param(POD_CGROUP, "/usr/bin/nvidia-persistenced", ProcessIdentity(CID, "main", "train", "ml"),
                 id="tenant-container-named-like-a-daemon"),
    pytest.param(f"0::/kubepods/burstable/pod{UID}/strange-naming\n", "/usr/bin/nvidia-persistenced",
                 ProcessIdentity(), id="pod-cgroup-of-unknown-naming"),
])
def test_only_a_listed_host_executable_is_infrastructure(tmp_path: Path, cgroup: str, exe: str,
                                                          expected: ProcessIdentity) -> None:
    assert resolver(fake_proc(tmp_path, 42, cgroup, exe))(42) == expected


def test_the_name_comes_from_the_exe_link_not_comm(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 42, HOST_CGROUP, "/opt/miner/bin/miner")
    (Path(proc) / "42" / "comm").write_text("nvidia-persistenced\n")  # a process may rename itself
    assert resolver(proc)(42) == ProcessIdentity()


def test_an_empty_setting_names_no_infrastructure(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 42, HOST_CGROUP, "/usr/bin/nvidia-persistenced")
    assert resolver(proc, frozenset())(42) == ProcessIdentity()


def test_the_setting_takes_file_names_only() -> None:
    assert MonitorConfig().infrastructure == ("nvidia-persistenced", "nv-hostengine", "dcgm-exporter")
    for bad in ("/usr/bin/nvidia-persistenced", "", " dcgm-exporter"):
        with pytest.raises(ValueError, match="file name"):
            MonitorConfig(infrastructure=(bad,))


def recorder(tmp_path: Path, processes: FakeProcesses) -> UsageRecorder:
    identities = {100: ProcessIdentity(infrastructure="nvidia-persistenced"),
                  200: ProcessIdentity("cid", "main", "train", "ml")}
    return UsageRecorder("n1", [GPU0], StateFile(tmp_path / "state.json"), processes,
                         identify=lambda pid: identities.get(pid, ProcessIdentity()), ignore_pids=())


def test_a_card_held_only_by_persistenced_stays_free_and_its_opens_are_no_use(tmp_path: Path) -> None:
    processes = FakeProcesses()
    processes.spawn(100, GPU0)
    rec = recorder(tmp_path, processes)
    rec.on_event(DeviceEvent(EventKind.OPEN, GPU0, 100, 10.0))
    device = rec.state.devices[0]
    assert [h.infrastructure for h in device.holders] == ["nvidia-persistenced"]  # shown, and marked
    assert (device.state, device.last_use, device.users) == (DeviceState.FREE, None, ())
    rec.on_event(DeviceEvent(EventKind.OPEN, GPU0, 100, 20.0))  # another descriptor of the same daemon
    assert rec.state.devices[0].last_use is None
    rec.set_state(GPU0, DeviceState.IDLE)  # the idle rule cannot mark it either
    assert rec.state.devices[0].state is DeviceState.FREE
    detector = IdleDetector({GPU0: 0}, idle_after=60.0)
    for now in (0.0, 100.0, 1000.0):
        assert detector.observe(rec.state, UsageSample(now, (CardUsage(0, 0, 300, 16384),))) == {}
    loaded = StateFile(tmp_path / "state.json").load()
    assert loaded is not None and loaded.devices[0].holders[0].infrastructure == "nvidia-persistenced"


def test_a_user_beside_persistenced_makes_the_card_busy_then_idle(tmp_path: Path) -> None:
    processes = FakeProcesses()
    processes.spawn(100, GPU0)
    processes.spawn(200, GPU0)
    rec = recorder(tmp_path, processes)
    rec.on_event(DeviceEvent(EventKind.OPEN, GPU0, 100, 5.0))
    rec.on_event(DeviceEvent(EventKind.OPEN, GPU0, 200, 10.0))
    assert (rec.state.devices[0].state, rec.state.devices[0].last_use) == (DeviceState.BUSY, 10.0)
    processes.close(100, GPU0)
    rec.on_event(DeviceEvent(EventKind.CLOSE, GPU0, 100, 50.0))  # the daemon's close is no use either
    assert rec.state.devices[0].last_use == 10.0
    detector = IdleDetector({GPU0: 0}, idle_after=60.0)
    changes = [detector.observe(rec.state, UsageSample(now, (CardUsage(0, 0, 300, 16384),)))
               for now in (10.0, 40.0, 80.0)]
    assert changes == [{GPU0: DeviceState.BUSY}, {}, {GPU0: DeviceState.IDLE}]
    processes.close(200, GPU0)
    rec.on_event(DeviceEvent(EventKind.CLOSE, GPU0, 200, 90.0))
    assert rec.state.devices[0].state is DeviceState.FREE


def test_a_restart_keeps_a_card_held_only_by_infrastructure_free(tmp_path: Path) -> None:
    processes = FakeProcesses()
    processes.spawn(100, GPU0)
    rec = recorder(tmp_path, processes)
    rec.restore()  # found by the scan, not by an open
    device = rec.state.devices[0]
    assert (device.state, [h.pid for h in device.holders]) == (DeviceState.FREE, [100])
    again = recorder(tmp_path, processes)
    again.restore()
    assert again.state.devices[0].state is DeviceState.FREE and again.state.devices[0].holders[0].infrastructure


def test_the_state_file_round_trips_the_mark_and_reads_files_without_it() -> None:
    held = Holder(pid=7, start_time=70, since=1.0, infrastructure="nv-hostengine")
    state = UsageState("n1", 2.0, (DeviceUsage(GPU0, (held,), None, DeviceState.FREE),))
    assert decode_state(encode_state(state)) == state
    old = encode_state(state).replace(b',"infrastructure":"nv-hostengine"', b"")
    [device] = decode_state(old.replace(b'"state":"free"', b'"state":"busy"')).devices
    assert device.holders[0].infrastructure == ""
    with pytest.raises(StateFileError, match="free with 1 holder"):
        decode_state(old)
    tenant = encode_state(state).replace(b'"containerId":""', b'"containerId":"cid"')
    with pytest.raises(StateFileError, match="in a container"):
        decode_state(tenant)


def test_a_restart_judges_host_holders_by_the_new_setting(tmp_path: Path) -> None:
    """An upgraded agent reading its predecessor's file marks the daemon the old agent could not (else
    lending stayed blocked until the daemon restarted: at the next boot); an agent restarted with
    ``--infrastructure-holders ""`` unmarks it (the strict rule again, the card busy)."""
    processes = FakeProcesses()
    processes.spawn(100, GPU0)
    file = StateFile(tmp_path / "state.json")
    unmarked = Holder(pid=100, start_time=1000, since=1.0)
    file.write(UsageState("n1", 2.0, (DeviceUsage(GPU0, (unmarked,), 1.0, DeviceState.BUSY),)))
    upgraded = recorder(tmp_path, processes)
    upgraded.restore()
    [device] = upgraded.state.devices
    assert (device.state, device.holders[0].infrastructure) == (DeviceState.FREE, "nvidia-persistenced")
    strict = UsageRecorder("n1", [GPU0], file, processes, identify=lambda pid: ProcessIdentity(), ignore_pids=())
    strict.restore()
    [device] = strict.state.devices
    assert (device.state, device.holders[0].infrastructure) == (DeviceState.BUSY, "")
