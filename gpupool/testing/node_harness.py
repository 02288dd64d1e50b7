"""Runs the node agent's device plugins against the fake kubelet, in one event loop, with pods from
an in-memory source (the node agent's tests and ``bench/allocate.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpupool.api.names import ResourceNames
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.allocated_codec import encode_served
from gpupool.nodeagent.deviceplugin.manager import DevicePluginManager
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.isolation.backends import Enforcement
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.testing.fake_kubelet import FakeKubelet, FakePod
from gpupool.testing.fake_node import agent_on_fake_kubelet
from gpupool.testing.memory_pod_source import InMemoryPodSource

NAMES = ResourceNames()


def fake_pod(pod: dict[str, Any]) -> FakePod:
    """The fake kubelet's view of a pod JSON."""
    meta, spec = pod["metadata"], pod["spec"]

    def containers(key: str) -> list[tuple[str, dict[str, int]]]:
        return [(c["name"], {k: int(v) for k, v in c.get("resources", {}).get("limits", {}).items()})
                for c in spec.get(key, [])]

    created = datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00")).timestamp()
    sidecars = frozenset(c["name"] for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always")
    return FakePod(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"], created=created,
                   init=containers("initContainers"), app=containers("containers"), sidecars=sidecars)


async def admit_all_running(kubelet: FakeKubelet, pods: Iterable[dict[str, Any]],
                            timeout_s: float = 30) -> dict[tuple[str, str], FakePod]:
    """Admit ``pods`` one at a time, wait until kubelet is idle, check that every pod runs (the
    failures are listed with their reasons otherwise); the kubelet's pods by (namespace, name)."""
    for pod in pods:
        await kubelet.handle_pod_additions([fake_pod(pod)])
    await kubelet.wait_idle(timeout_s)
    fakes = {(p.namespace, p.name): p for p in kubelet.pod_manager.values()}
    assert [(key, p.phase, p.reason) for key, p in fakes.items() if p.phase != "Running"] == []
    return fakes


@dataclass
class Node:
    kubelet: FakeKubelet
    agent: NodeAgent
    source: InMemoryPodSource
    backend: FakeGpuBackend
    manager: DevicePluginManager
    dir: str


@contextlib.asynccontextmanager
async def running_node(gpu_file: dict[str, Any], pods: list[dict[str, Any]] | None = None, seed: int = 0,
                       reject: Callable[[FakePod], str | None] | None = None,
                       aliases: tuple[str, ...] = (), enforcement: Enforcement | None = None,
                       names: ResourceNames = NAMES) -> AsyncIterator[Node]:
    """A fake kubelet with the agent's plugins registered (gpupool's resources and ``aliases``),
    the agent enforcing shares with ``enforcement`` (default: none)."""
    backend = FakeGpuBackend.from_dict(gpu_file)
    source = InMemoryPodSource(names)
    for pod in pods or []:
        source.put(pod)

    def make_agent(reader: PodResourcesClient) -> NodeAgent:
        return NodeAgent("node-a", names, backend, source, reader, encode_served, poll_s=0.2, aliases=aliases,
                         enforcement=enforcement)

    async with agent_on_fake_kubelet(make_agent, seed=seed, reject=reject) as node:
        yield Node(node.kubelet, node.agent, source, backend, node.manager, node.dir)
