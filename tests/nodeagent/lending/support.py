"""Pods, a usage state and a monitor stand-in for the lending service's tests."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from gpupool.api.annotations import Assignment, CardRef, ContainerCards, encode_assignment
from gpupool.api.lending import LendingNames
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard, Topology
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.monitor.service import MonitorConfig
from gpupool.nodeagent.monitor.usage_sampling import CardUsage, UsageSample
from gpupool.nodeagent.monitor.usage_state import DeviceState, DeviceUsage, Holder, UsageState
from gpupool.nodeagent.node_pod import NodePod, decode_node_pod

NAMES = ResourceNames()
LEND = LendingNames()
CARD_MIB = 16384
WHEN = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def pod_json(name: str, *, cards: tuple[int, ...] = (), borrowed_from: str = "", priority: int | None = None,
             annotations: dict[str, str] | None = None, container: str = "c", namespace: str = "ns",
             owner_uid: str = "") -> dict[str, Any]:
    """A pod as the watch delivers it: container ``c`` with ID ``id-<name>``, booking ``cards``."""
    notes = dict(annotations or {})
    if cards:
        notes[NAMES.assignment] = encode_assignment(Assignment("n1", WHEN, (ContainerCards(
            container, tuple(CardRef(c, f"GPU-{c}", 4096, 300) for c in cards)),)))
    if borrowed_from:
        notes[LEND.borrowed] = "true"
        notes[LEND.borrowed_from] = borrowed_from
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "annotations": notes}
    if owner_uid:
        meta["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": owner_uid, "controller": True}]
    spec: dict[str, Any] = {"containers": [{"name": container}]}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": meta, "spec": spec,
            "status": {"containerStatuses": [{"name": container, "containerID": f"containerd://id-{name}"}]}}


def decoded(*objs: dict[str, Any]) -> list[NodePod]:
    """Pods as the agent's pod cache hands them to its feeds (one decode each)."""
    found = [decode_node_pod(obj, NAMES) for obj in objs]
    assert all(pod is not None for pod in found)
    return [pod for pod in found if pod is not None]


def inventory(cards: int = 2) -> GpuInventory:
    return GpuInventory(tuple(GpuCard(i, f"GPU-{i}", "Tesla-T4", CARD_MIB) for i in range(cards)),
                        Topology.flat(cards),
                        tuple(f"/dev/nvidia{i}" for i in range(cards)))


def holder(pod: str, pid: int, container: str = "c", since: float = 0.0) -> Holder:
    return Holder(pid=pid, start_time=pid, since=since, container_id=f"id-{pod}", container=container, pod=pod,
                  namespace="ns")


class FakeRecorder:
    def __init__(self) -> None:
        self.rules: tuple[Any, ...] = ()

    def use_rules(self, *rules: Any) -> None:
        self.rules = rules


@dataclass
class FakeMonitor:
    """What the service reads of the usage monitor."""

    state_path: str
    cards: dict[str, int] = field(default_factory=lambda: {"/dev/nvidia0": 0, "/dev/nvidia1": 1})
    devices: dict[str, DeviceUsage] = field(default_factory=dict)
    last_sample: UsageSample | None = None
    recorder: FakeRecorder = field(default_factory=FakeRecorder)

    @property
    def config(self) -> MonitorConfig:
        return MonitorConfig(self.state_path)

    @property
    def state(self) -> UsageState:
        return UsageState("n1", 0.0, tuple(self.devices.get(p, DeviceUsage(p)) for p in sorted(self.cards)))

    def hold(self, path: str, *holders: Holder, state: DeviceState = DeviceState.BUSY) -> None:
        self.devices[path] = DeviceUsage(path, tuple(sorted(holders, key=lambda h: h.pid)), 100.0, state)

    def sample(self, used: dict[int, int]) -> None:
        self.last_sample = UsageSample(200.0, tuple(CardUsage(i, 0, used.get(i, 0), CARD_MIB)
                                                    for i in sorted(self.cards.values())))

