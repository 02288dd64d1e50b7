"""Infrastructure pods (issue 26): a pod that asked for no GPU in a namespace the admin listed
(``--infrastructure-namespaces``: the GPU Operator's DCGM exporter, its driver container) holds the
cards without making them held, as a host daemon does; the same pod elsewhere, or a pod there that
booked a share or asked any device plugin for a GPU (``nvidia.com/gpu`` of NVIDIA's), is an
ordinary holder.

The pods reach the container directory as the agent's pod cache hands them over (decoded once, fed
through :class:`DirectoryFeed`); the resolver reads a fake /proc; the recorder runs on a scripted
process table.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from gpupool.api.names import ResourceNames
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.containers.pod_containers import DirectoryFeed
from gpupool.nodeagent.gpu_resources import gpu_resources_asked, is_gpu_resource
from gpupool.nodeagent.monitor.container_resolver import ContainerResolver
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind
from gpupool.nodeagent.monitor.idle import IdleDetector
from gpupool.nodeagent.monitor.recorder import UsageRecorder
from gpupool.nodeagent.monitor.service import MonitorConfig
from gpupool.nodeagent.monitor.state_codec import StateFileError, decode_state, encode_state
from gpupool.nodeagent.monitor.state_file import StateFile
from gpupool.nodeagent.monitor.usage_sampling import CardUsage, UsageSample
from gpupool.nodeagent.monitor.usage_state import DeviceState, DeviceUsage, Holder, ProcessIdentity, UsageState
from gpupool.nodeagent.node_pod import decode_node_pod
from tests.nodeagent.monitor.fake_processes import FakeProcesses

GPU0 = "/dev/nvidia0"
OPERATOR = "gpu-operator"
LISTED = frozenset({OPERATOR})
NAMES = ResourceNames()
EXPORTER_PID, ELSEWHERE_PID, BOOKED_PID, TRAIN_PID = 100, 200, 300, 400


def uid(name: str) -> str:
    """A pod UID per pod name (hex, as the API server's)."""
    return f"0f8d4c2e-2b1a-4c3d-9e8f-{name.encode().hex()[-12:]:0>12}"


def cid(name: str) -> str:
    """A runtime container ID per pod name."""
    return (name.encode().hex() + "0" * 64)[:64]


def pod_json(name: str, namespace: str, *, limits: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod with one container ``main``; a DaemonSet's at system-node-critical priority, as the GPU
    Operator's pods are."""
    container: dict[str, Any] = {"name": "main"}
    if limits:
        container["resources"] = {"limits": limits}
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid(name),
                         "ownerReferences": [{"kind": "DaemonSet", "name": name, "uid": "ds", "controller": True}]},
            "spec": {"containers": [container], "priority": 2000001000},
            "status": {"containerStatuses": [{"name": "main", "containerID": f"containerd://{cid(name)}"}]}}


EXPORTER = pod_json("dcgm-exporter", OPERATOR)
ELSEWHERE = pod_json("dcgm-exporter-2", "monitoring")
"""The same DaemonSet in a namespace nobody listed (tenants may create pods there)."""
BOOKED = pod_json("smoke-test", OPERATOR, limits={NAMES.gpu_mem: "1024"})
"""A pod in the listed namespace that booked a gpupool share: its limits and ownership apply."""
TRAIN = pod_json("train", "ml", limits={NAMES.gpu_mem: "4096"})
PIDS = {EXPORTER_PID: EXPORTER, ELSEWHERE_PID: ELSEWHERE, BOOKED_PID: BOOKED, TRAIN_PID: TRAIN}


def fake_proc(tmp_path: Path) -> str:
    """A /proc where each pid runs in its pod's container (cgroup v2, systemd naming)."""
    proc = tmp_path / "proc"
    for pid, pod in PIDS.items():
        name = pod["metadata"]["name"]
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-pod{uid(name).replace('-', '_')}.slice/cri-containerd-{cid(name)}.scope\n")
        os.symlink(f"/usr/bin/{name}", proc / str(pid) / "exe")
    return str(proc)


def directory_with(*pods: dict[str, Any]) -> InMemoryContainerDirectory:
    directory = InMemoryContainerDirectory()
    records = [decode_node_pod(p, NAMES) for p in pods]
    DirectoryFeed(directory).on_list([r for r in records if r is not None])
    return directory


def resolver(tmp_path: Path, directory: InMemoryContainerDirectory,
             namespaces: frozenset[str] = LISTED) -> ContainerResolver:
    return ContainerResolver(directory, fake_proc(tmp_path), infrastructure_namespaces=namespaces)


@pytest.mark.parametrize(("pid", "namespaces", "infrastructure"), [
    pytest.param(EXPORTER_PID, LISTED, OPERATOR, id="daemonset-in-the-listed-namespace"),
    pytest.param(ELSEWHERE_PID, LISTED, "", id="the-same-daemonset-elsewhere"),
    pytest.param(BOOKED_PID, LISTED, "", id="a-pod-there-that-booked-a-share"),
    pytest.param(TRAIN_PID, LISTED, "", id="a-tenants-pod"),
    pytest.param(EXPORTER_PID, frozenset(), "", id="no-namespace-listed"),
])
def test_only_an_unbooked_pod_in_a_listed_namespace_is_infrastructure(
        tmp_path: Path, pid: int, namespaces: frozenset[str], infrastructure: str) -> None:
    who = resolver(tmp_path, directory_with(*PIDS.values()), namespaces)(pid)
    meta = PIDS[pid]["metadata"]
    assert who == ProcessIdentity(cid(meta["name"]), "main", meta["name"], meta["namespace"], infrastructure)


def test_a_pod_whose_container_is_not_listed_yet_is_judged_by_its_uid(tmp_path: Path) -> None:
    early = {**EXPORTER, "status": {"containerStatuses": [{"name": "main"}]}}  # no container ID reported yet
    who = resolver(tmp_path, directory_with(early))(EXPORTER_PID)
    assert (who.pod, who.container, who.infrastructure) == ("dcgm-exporter", "", OPERATOR)


def test_a_pod_the_directory_does_not_know_is_not_infrastructure(tmp_path: Path) -> None:
    assert resolver(tmp_path, directory_with())(EXPORTER_PID) == ProcessIdentity(cid("dcgm-exporter"))


def test_an_unreadable_pod_counts_as_booking(tmp_path: Path) -> None:
    garbled = {**EXPORTER, "metadata": {**EXPORTER["metadata"], "annotations": {NAMES.assignment: "{not json"}}}
    assert resolver(tmp_path, directory_with(garbled))(EXPORTER_PID).infrastructure == ""


def test_each_infrastructure_pod_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    resolve = resolver(tmp_path, directory_with(*PIDS.values()))
    with caplog.at_level(logging.INFO, logger="gpupool.nodeagent.monitor.container_resolver"):
        for pid in (EXPORTER_PID, EXPORTER_PID, ELSEWHERE_PID, TRAIN_PID, EXPORTER_PID):
            resolve(pid)
    said = [r.getMessage() for r in caplog.records if "infrastructure" in r.getMessage()]
    assert len(said) == 1 and "gpu-operator/dcgm-exporter" in said[0] and "dcgm-exporter" in said[0]


def test_the_setting_takes_namespace_names_only() -> None:
    assert MonitorConfig().infrastructure_namespaces == ()  # safe by default: nobody is exempt
    assert MonitorConfig(infrastructure_namespaces=("gpu-operator", "nvidia-dcgm")).infrastructure_namespaces
    for bad in ("", "GPU-Operator", "gpu operator", "gpu-operator/", "-x", "x" * 64):
        with pytest.raises(ValueError, match="namespace's name"):
            MonitorConfig(infrastructure_namespaces=(bad,))


def recorder(tmp_path: Path, processes: FakeProcesses, directory: InMemoryContainerDirectory,
             namespaces: frozenset[str] = LISTED) -> UsageRecorder:
    return UsageRecorder("n1", [GPU0], StateFile(tmp_path / "state.json"), processes,
                         identify=resolver(tmp_path, directory, namespaces), ignore_pids=())


def test_a_card_the_exporter_alone_holds_stays_free_and_its_opens_are_no_use(tmp_path: Path) -> None:
    processes = FakeProcesses()
    processes.spawn(EXPORTER_PID, GPU0)
    processes.spawn(TRAIN_PID, GPU0)
    rec = recorder(tmp_path, processes, directory_with(*PIDS.values()))
    rec.on_event(DeviceEvent(EventKind.OPEN, GPU0, EXPORTER_PID, 10.0))
    device = rec.state.devices[0]
    assert [(h.pod, h.infrastructure) for h in device.holders] == [("dcgm-exporter", OPERATOR)]  # shown, marked
    assert (device.state, device.last_use, device.users) == (DeviceState.FREE, None, ())
    rec.set_state(GPU0, DeviceState.IDLE)
    assert rec.state.devices[0].state is DeviceState.FREE
    rec.on_event(DeviceEvent(EventKind.OPEN, GPU0, TRAIN_PID, 20.0))  # a tenant beside it: held, and used
    assert (rec.state.devices[0].state, rec.state.devices[0].last_use) == (DeviceState.BUSY, 20.0)
    rec.on_event(DeviceEvent(EventKind.OPEN, GPU0, EXPORTER_PID, 30.0))  # the exporter's next poll
    detector = IdleDetector({GPU0: 0}, idle_after=60.0)
    changes = [detector.observe(rec.state, UsageSample(now, (CardUsage(0, 0, 300, 16384),)))
               for now in (20.0, 50.0, 81.0)]
    assert changes == [{GPU0: DeviceState.BUSY}, {}, {GPU0: DeviceState.IDLE}]  # idle from the tenant's use
    processes.close(TRAIN_PID, GPU0)
    rec.on_event(DeviceEvent(EventKind.CLOSE, GPU0, TRAIN_PID, 90.0))
    assert rec.state.devices[0].state is DeviceState.FREE


@pytest.mark.parametrize("pod", [ELSEWHERE, BOOKED], ids=["another-namespace", "booked-a-share"])
def test_the_same_holder_anywhere_else_holds_the_card(tmp_path: Path, pod: dict[str, Any]) -> None:
    pid = next(p for p, v in PIDS.items() if v is pod)
    processes = FakeProcesses()
    processes.spawn(pid, GPU0)
    rec = recorder(tmp_path, processes, directory_with(*PIDS.values()))
    rec.on_event(DeviceEvent(EventKind.OPEN, GPU0, pid, 10.0))
    device = rec.state.devices[0]
    assert (device.state, device.last_use, [h.infrastructure for h in device.users]) == (DeviceState.BUSY, 10.0, [""])


def test_a_holder_found_before_the_pod_watch_named_its_pod_is_judged_once_it_does(tmp_path: Path) -> None:
    """The agent's start: the restore's scan finds the exporter while the directory is still empty."""
    processes = FakeProcesses()
    processes.spawn(EXPORTER_PID, GPU0)
    directory = InMemoryContainerDirectory()
    rec = recorder(tmp_path, processes, directory)
    rec.restore()
    assert rec.state.devices[0].state is DeviceState.BUSY  # unknown yet: it errs towards held
    DirectoryFeed(directory).on_list([r for r in (decode_node_pod(EXPORTER, NAMES),) if r is not None])
    rec.identify_again()
    [holder] = rec.state.devices[0].holders
    assert (holder.container, holder.infrastructure, rec.state.devices[0].state) == ("main", OPERATOR,
                                                                                     DeviceState.FREE)


def exporter_holder(infrastructure: str = OPERATOR) -> Holder:
    return Holder(pid=EXPORTER_PID, start_time=1000, since=1.0, container_id=cid("dcgm-exporter"), container="main",
                  pod="dcgm-exporter", namespace=OPERATOR, infrastructure=infrastructure)


def test_the_state_file_round_trips_an_infrastructure_pod_and_refuses_a_mark_that_is_not_its_namespace() -> None:
    state = UsageState("n1", 2.0, (DeviceUsage(GPU0, (exporter_holder(),), None, DeviceState.FREE),))
    assert decode_state(encode_state(state)) == state
    for wrong in (b'"infrastructure":"dcgm-exporter"', b'"infrastructure":"kube-system"'):
        with pytest.raises(StateFileError, match="in a container"):
            decode_state(encode_state(state).replace(b'"infrastructure":"gpu-operator"', wrong))
    no_pod = encode_state(state).replace(b'"pod":"dcgm-exporter"', b'"pod":""')
    with pytest.raises(StateFileError, match="in a container"):
        decode_state(no_pod)


@pytest.mark.parametrize(("recorded", "namespaces", "judged", "state"), [
    pytest.param(OPERATOR, LISTED, OPERATOR, DeviceState.FREE, id="kept"),
    pytest.param(OPERATOR, frozenset(), "", DeviceState.BUSY, id="namespace-no-longer-listed"),
    pytest.param("", LISTED, OPERATOR, DeviceState.FREE, id="namespace-listed-since"),
])
def test_a_restart_keeps_the_mark_until_the_pod_is_known_then_judges_it_by_the_new_setting(
        tmp_path: Path, recorded: str, namespaces: frozenset[str], judged: str, state: DeviceState) -> None:
    processes = FakeProcesses()
    processes.spawn(EXPORTER_PID, GPU0)
    file = StateFile(tmp_path / "state.json")
    before = DeviceState.FREE if recorded else DeviceState.BUSY
    file.write(UsageState("n1", 2.0, (DeviceUsage(GPU0, (exporter_holder(recorded),), 1.0, before),)))
    directory = InMemoryContainerDirectory()
    rec = recorder(tmp_path, processes, directory, namespaces)
    rec.restore()  # the pod watch starts after the restore: the previous agent's mark stands meanwhile
    [device] = rec.state.devices
    assert (device.holders[0].infrastructure, device.state) == (recorded, before)
    rec.identify_again()  # still unknown: still the previous mark
    assert rec.state.devices[0].holders[0].infrastructure == recorded
    DirectoryFeed(directory).on_list([r for r in (decode_node_pod(EXPORTER, NAMES),) if r is not None])
    rec.identify_again()
    [device] = rec.state.devices
    assert (device.holders[0], device.state) == (exporter_holder(judged), state)
    assert StateFile(tmp_path / "state.json").load() == rec.state  # written, and readable again


HAMI = ResourceNames(hami=True)


@pytest.mark.parametrize(("names", "limits", "requests"), [
    pytest.param(NAMES, {"nvidia.com/gpu": "1"}, None, id="nvidia-device-plugin-gpu"),
    pytest.param(HAMI, {"nvidia.com/gpu": "1"}, None, id="the-same-name-served-as-hamis"),
    pytest.param(NAMES, {"nvidia.com/mig-1g.10gb": "1"}, None, id="a-mig-profile"),
    pytest.param(NAMES, None, {"nvidia.com/gpu.shared": "1"}, id="time-sliced-requests-only"),
    pytest.param(NAMES, {"amd.com/gpu": "1"}, None, id="another-vendors-gpu"),
    pytest.param(NAMES, {"gpu.intel.com/i915": "1"}, None, id="intels-gpu"),
    pytest.param(NAMES, {"aliyun.com/gpu-mem": "4"}, None, id="gpushare-alias"),
    pytest.param(NAMES, {"tencent.com/vcuda-core": "50"}, None, id="gpumanager-alias"),
    pytest.param(NAMES, {"nvidia.com/gpu": "0"}, None, id="asked-for-none-of-them-still-asked"),
])
def test_a_pod_there_that_asked_any_plugin_for_a_gpu_is_a_tenant_not_infrastructure(
        tmp_path: Path, names: ResourceNames, limits: dict[str, str] | None,
        requests: dict[str, str] | None) -> None:
    """Booking none of gpupool's is not enough: a pod that asked NVIDIA's device plugin (or any
    other) for a card holds it as its tenant; a name gpupool serves (``--hami``, ``--serve-aliases``)
    or reads without serving is a GPU too."""
    pod = pod_json("dcgm-exporter", OPERATOR)
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    pod["spec"]["initContainers"] = [{"name": "setup", "resources": resources}]  # any container counts
    record = decode_node_pod(pod, names)
    assert record is not None and record.asks_gpus
    directory = InMemoryContainerDirectory()
    DirectoryFeed(directory).on_list([record])
    assert resolver(tmp_path, directory)(EXPORTER_PID).infrastructure == ""


def test_resources_that_are_no_gpu_leave_a_pod_infrastructure(tmp_path: Path) -> None:
    limits = {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "64Mi", "example.com/nic": "1", "ephemeral-storage": "1Gi"}
    pod = pod_json("dcgm-exporter", OPERATOR, limits=limits)
    record = decode_node_pod(pod, NAMES)
    assert record is not None and record.gpu_resources == frozenset() and not record.asks_gpus
    assert resolver(tmp_path, directory_with(pod))(EXPORTER_PID).infrastructure == OPERATOR


def test_gpu_resources_are_told_by_name() -> None:
    spec = {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": 2},
                                                       "requests": {"amd.com/gpu": 1}}},
                           {"name": "b", "resources": "garbled"}, "garbled"],
            "initContainers": [{"name": "c", "resources": {"limits": {f"{NAMES.domain}/gpu-mem": 4}}}]}
    assert gpu_resources_asked(spec, NAMES) == {"nvidia.com/gpu", "amd.com/gpu", f"{NAMES.domain}/gpu-mem"}
    assert gpu_resources_asked(None, NAMES) == frozenset()
    assert is_gpu_resource(ResourceNames(domain="example.org").gpu_core, ResourceNames(domain="example.org"))
    assert not is_gpu_resource("example.com/fpga", NAMES) and not is_gpu_resource("gpu", NAMES)
