"""The Allocate mapping against the real kubelet (1.37; the ``compat`` ones also on 1.35), one proof
per guarantee of docs/allocate-mapping.md, with the fake container runtime and ``gpupool
node-agent --fake-gpus``.

Pods are bound by the test (``spec.nodeName``) with the ``assignment-v1`` the extender would write
(its encoder, cards chosen here or by the allocation core), so kube-scheduler is not involved and
each test controls which cards a container gets. Each container's env comes back through the
apiserver (the fake runtime prints it to the container's log); what kubelet recorded comes from
its PodResources socket; what the agent answered from its ``/metrics``
(``gpupool_node_allocations_total{basis}``, refusals, mismatches).

* native sidecars (G2, G3, G4, G5): each container, a sidecar after a GPU init container
  included, gets its own grant; PodResources lists sidecars and app containers only; kubelet hands
  the sidecar the init container's devices, the rest of the devices are on the assigned cards.
* kubelet restart (G7, G1's batch): every pod re-admitted in one ADD from the checkpoint, no
  Allocate reaches the agent, running pods keep their containers and device IDs; a pod whose GPU
  init container finished is rejected if kubelet re-admits it before the plugins register again.
* in-place resize (G6): a CPU resize is admitted and actuated (on a kubelet with pod cgroups)
  without any Allocate; container, device IDs and grant unchanged.
* 200 pods created concurrently on one kubelet (G1-G4 under load), every container exact.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.annotations import Assignment, decode_allocated, decode_assignment, encode_assignment
from gpupool.api.names import ResourceNames
from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, NodeSpec, Placement
from gpupool.nodeagent.device_layout import DeviceLayout
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.types import PodResourcesSnapshot
from gpupool.testenv.kubelet import Kubelet
from gpupool.testing.node_workload import generate, limits_for
from tests.e2e.e2e_support import (
    NodeAgentProcess,
    StartKubelet,
    env_from_log,
    expected_grant,
    log_tail,
    wait_for,
)

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
CARD_MIB = 16384
GPUS = {"model": "Tesla-T4", "topology": [[0, 1], [2, 3]],
        "cards": [{"uuid": f"GPU-map-{i:04d}", "memoryMiB": CARD_MIB} for i in range(4)]}
IMAGE = "busybox:1.36"
#: Rules the agent may use on a real kubelet (docs/allocate-mapping.md, "The rule": decided).
DECIDED = {"unique", "newest"}

Slices = tuple[CardSlice, ...]


@dataclass(frozen=True)
class Box:
    """One container of a test pod: ``kind`` is ``init``, ``sidecar`` (``restartPolicy: Always``)
    or ``app``; no slices means no GPU."""

    name: str
    kind: str
    slices: Slices = ()


def shared(card: int, mib: int, percent: int) -> Slices:
    return (CardSlice(card, mib, percent * 10),)


@dataclass
class GpuNode:
    """A real kubelet, the node agent serving it, and the cards the agent fakes."""

    kubelet: Kubelet
    agent: NodeAgentProcess
    gpus: dict[str, Any]
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Manifests created on this node, by pod name."""

    @property
    def name(self) -> str:
        return self.kubelet.node_name

    @property
    def spec(self) -> NodeSpec:
        return NodeSpec(self.name, cpu_milli=10**7, memory_mib=10**8, cards=tuple(
            GpuCard(i, c["uuid"], self.gpus["model"], c["memoryMiB"]) for i, c in enumerate(self.gpus["cards"])))


def start_gpu_node(core_v1: client.CoreV1Api, start_kubelet: StartKubelet,
                   start_node_agent: Callable[..., NodeAgentProcess], prefix: str,
                   gpus: dict[str, Any] | None = None, config: Callable[[str], dict[str, Any]] | None = None,
                   ) -> GpuNode:
    """A kubelet (``config(node name)`` merged into its configuration), the agent, its devices."""
    gpus = gpus or GPUS
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(name, extra_config=config(name) if config else None)
    node = GpuNode(kubelet, start_node_agent(kubelet, yaml.safe_dump(gpus)), gpus)
    wait_devices(core_v1, node)
    return node


def wait_devices(core_v1: client.CoreV1Api, node: GpuNode) -> None:
    """Until kubelet advertises the agent's whole cards (every plugin registered)."""
    cards = str(len(node.gpus["cards"]))

    def ready() -> bool:
        assert node.agent.running(), node.agent.log()
        allocatable = core_v1.read_node(node.name).status.allocatable or {}
        return all(allocatable.get(r) not in (None, "0") for r in NAMES.all()) and allocatable.get(NAMES.gpu) == cards

    wait_for(ready, timeout=60, what=f"gpupool devices on {node.name}\n{node.agent.log()}")


def manifest(node: GpuNode, name: str, boxes: Iterable[Box], *, cpu: str | None = None) -> dict[str, Any]:
    """A pod bound to ``node`` whose ``assignment-v1`` gives each box its slices, as the extender
    writes it (a native sidecar is an app container to the extender)."""
    boxes = list(boxes)
    placement = Placement(name, node.name, 0, 0, tuple(
        ContainerAssignment(b.name, b.slices, init=b.kind == "init") for b in boxes if b.slices))
    when = dt.datetime.now(dt.UTC)
    notes = {NAMES.assignment: encode_assignment(Assignment.from_placement(placement, node.spec, when))}
    return pod_manifest(node, name, [(b.name, b.kind, limits_for(NAMES, placement, b.name)) for b in boxes],
                        notes, cpu=cpu)


def pod_manifest(node: GpuNode, name: str, containers: list[tuple[str, str, dict[str, int]]],
                 annotations: dict[str, str], *, cpu: str | None = None) -> dict[str, Any]:
    def spec(cname: str, kind: str, limits: dict[str, int]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": cname, "image": IMAGE,
                               "command": ["true"] if kind == "init" else ["sleep", "3600"]}
        if kind == "sidecar":
            out["restartPolicy"] = "Always"
        resources: dict[str, Any] = {"limits": {k: str(v) for k, v in limits.items()}} if limits else {}
        if cpu and kind == "app":
            resources["requests"] = {"cpu": cpu}
        if resources:
            out["resources"] = resources
        return out

    pod_spec: dict[str, Any] = {
        "nodeName": node.name, "terminationGracePeriodSeconds": 1,
        "initContainers": [spec(*c) for c in containers if c[1] != "app"],
        "containers": [spec(*c) for c in containers if c[1] == "app"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
            "spec": pod_spec}


def create(core_v1: client.CoreV1Api, namespace: str, node: GpuNode, pod: dict[str, Any]) -> None:
    node.pods[pod["metadata"]["name"]] = pod
    core_v1.create_namespaced_pod(namespace, pod)


def gpu_containers(pod: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """(container, gpupool limits) of every container of a manifest that asks for a GPU."""
    spec = pod["spec"]
    out = []
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        limits = {k: v for k, v in (c.get("resources", {}).get("limits") or {}).items() if k in NAMES.all()}
        if limits:
            out.append((c["name"], limits))
    return out


def allocate_calls(pods: Iterable[dict[str, Any]]) -> int:
    """kubelet calls Allocate once per (container, resource) it admits (G2)."""
    return sum(sum(1 for v in limits.values() if int(v) > 0) for p in pods for _, limits in gpu_containers(p))


def phases(core_v1: client.CoreV1Api, namespace: str) -> dict[str, client.V1Pod]:
    return {p.metadata.name: p for p in core_v1.list_namespaced_pod(namespace).items}


def wait_running(core_v1: client.CoreV1Api, namespace: str, names: Iterable[str], node: GpuNode | None = None,
                 timeout: float = 90) -> dict[str, client.V1Pod]:
    wanted = set(names)

    def all_running() -> dict[str, client.V1Pod] | None:
        pods = phases(core_v1, namespace)
        failed = {n: (p.status.reason, p.status.message) for n, p in pods.items()
                  if n in wanted and p.status.phase == "Failed"}
        assert not failed, f"{failed}\n{node.agent.log() if node else ''}"
        running = {n: p for n, p in pods.items() if n in wanted and p.status.phase == "Running"}
        return running if set(running) == wanted else None

    return wait_for(all_running, timeout=timeout, interval=0.5,
                    what=f"{len(wanted)} pods Running\n{node.agent.log() if node else ''}")


def container_env(core_v1: client.CoreV1Api, namespace: str, pod: str, container: str) -> dict[str, str]:
    def read() -> dict[str, str] | None:
        return env_from_log(str(core_v1.read_namespaced_pod_log(pod, namespace, container=container))) or None

    return wait_for(read, timeout=30, what=f"log of {pod}/{container}")


def check_grants(core_v1: client.CoreV1Api, namespace: str, pods: dict[str, dict[str, Any]], threads: int = 8) -> int:
    """Every GPU container's env is exactly its assignment (named for it), and ``allocated-v1``
    records the assignment's cards for every GPU container; returns the containers checked."""
    def one(name: str) -> int:
        assignment = {c.name: c.cards for c in decode_assignment(pods[name]["metadata"]["annotations"][
            NAMES.assignment]).containers}
        for cname, _limits in gpu_containers(pods[name]):
            env = container_env(core_v1, namespace, name, cname)
            want = expected_grant(namespace, name, cname, assignment[cname])
            assert {k: env.get(k) for k in want} == want, (name, cname)

        def recorded() -> dict[str, list[tuple[int, str, int, int]]] | None:
            notes = core_v1.read_namespaced_pod(name, namespace).metadata.annotations or {}
            if NAMES.allocated not in notes:
                return None
            got = {c.name: [(r.index, r.uuid, r.memory_mib, r.compute) for r in c.cards]
                   for c in decode_allocated(notes[NAMES.allocated]).containers}
            return got if set(got) == set(assignment) else None

        got = wait_for(recorded, timeout=30, what=f"allocated-v1 on {name} for every GPU container")
        assert got == {c: [(r.index, r.uuid, r.memory_mib, r.compute) for r in cards]
                       for c, cards in assignment.items()}, name
        return len(assignment)

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(one, sorted(pods)))


def pod_resources(kubelet: Kubelet) -> PodResourcesSnapshot:
    """kubelet's PodResources ``List``, read from its socket as the agent does."""
    async def read() -> PodResourcesSnapshot:
        reader = PodResourcesClient(str(kubelet.pod_resources_socket))
        try:
            return await reader.list()
        finally:
            await reader.close()

    return asyncio.run(read())


def ours(devices: Mapping[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    return {r: ids for r, ids in devices.items() if r in NAMES.all() and ids}


@dataclass
class Counters:
    """What the agent's ``/metrics`` says it answered."""

    bases: dict[str, float]
    refused: float
    mismatches: float

    @property
    def answered(self) -> int:
        return int(sum(self.bases.values()))


def counters(agent: NodeAgentProcess) -> Counters:
    out = Counters({}, 0.0, 0.0)
    for family in text_string_to_metric_families(agent.metrics()):
        for s in family.samples:
            if s.name == "gpupool_node_allocations_total":
                out.bases[s.labels["basis"]] = s.value
            elif s.name == "gpupool_node_allocate_refused_total":
                out.refused = s.value
            elif s.name == "gpupool_node_allocation_mismatches_total":
                out.mismatches = s.value
    return out


def wait_answered(agent: NodeAgentProcess, calls: int) -> Counters:
    """Until the agent has answered ``calls`` Allocates; none refused, none recorded elsewhere, and
    each decided by an exact rule."""
    def enough() -> Counters | None:
        seen = counters(agent)
        return seen if seen.answered >= calls else None

    seen = wait_for(enough, timeout=30, what=f"{calls} Allocate calls answered\n{agent.log()}")
    assert (seen.answered, seen.refused, seen.mismatches) == (calls, 0, 0), (seen, agent.log())
    assert set(seen.bases) <= DECIDED, seen.bases
    return seen


def containers_of(pod: client.V1Pod) -> dict[str, tuple[str | None, int]]:
    statuses = [*(pod.status.init_container_statuses or []), *(pod.status.container_statuses or [])]
    return {s.name: (s.container_id, s.restart_count) for s in statuses}


@pytest.mark.compat
def test_native_sidecars_with_gpu_limits_get_their_own_grants_and_are_listed(
    core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet,
    start_node_agent: Callable[..., NodeAgentProcess],
) -> None:
    """G2, G3, G4, G5 with native sidecars. Every shared slice asks gpu-mem and gpu-core, so kubelet
    records a sidecar's first resource (and lists it) before it allocates the second."""
    node = start_gpu_node(core_v1, start_kubelet, start_node_agent, "e2e-sidecar")
    pods = {
        # a GPU sidecar beside an app container without GPU
        "sidecar-only": [Box("side", "sidecar", shared(1, 2048, 20)), Box("app", "app")],
        # a GPU init container, then a GPU sidecar of the same size (kubelet hands it the init
        # container's devices: G4), then a GPU app container
        "init-sidecar-app": [Box("warmup", "init", shared(2, 2048, 20)), Box("side", "sidecar", shared(3, 2048, 20)),
                             Box("main", "app", shared(3, 4096, 30))],
        # a sidecar before a GPU init container: the sidecar's devices do not finish the init one
        "sidecar-init-app": [Box("side", "sidecar", shared(2, 1024, 10)), Box("migrate", "init", shared(2, 1024, 10)),
                             Box("main", "app", shared(1, 1024, 10))],
        # the same shape as the first: equal requests, the newer pod decides (G1)
        "sidecar-twin": [Box("side", "sidecar", shared(3, 2048, 20)), Box("app", "app")],
    }
    for name, boxes in pods.items():
        create(core_v1, namespace, node, manifest(node, name, boxes))
    wait_running(core_v1, namespace, pods, node)
    assert check_grants(core_v1, namespace, node.pods) == sum(1 for b in pods.values() for x in b if x.slices)
    wait_answered(node.agent, allocate_calls(node.pods.values()))

    listed = pod_resources(node.kubelet)
    for name, boxes in pods.items():
        # G3: native sidecars and app containers, in that order; regular init containers never
        assert list(listed[(namespace, name)]) == [b.name for b in boxes if b.kind == "sidecar"] + [
            b.name for b in boxes if b.kind == "app"], name
    devices = {(n, c): ours(d) for (_ns, n), cs in listed.items() if _ns == namespace for c, d in cs.items()}
    # G4: a sidecar keeps its devices; no listed container shares an ID with another
    every = [i for d in devices.values() for ids in d.values() for i in ids]
    assert len(every) == len(set(every))
    # G5 (GetPreferredAllocation reads PodResources): IDs on the container's own cards (never card
    # 0, where an answer without the pod being admitted would steer), except where kubelet reused a
    # regular init container's devices (G4): the sidecar after "warmup", the app after "migrate"
    reused = {("init-sidecar-app", "side"): {2}, ("sidecar-init-app", "main"): {2}}
    for (name, cname), d in devices.items():
        [box] = [b for b in pods[name] if b.name == cname]
        cards = {DeviceLayout.card_of(i) for ids in d.values() for i in ids}
        assert cards == reused.get((name, cname), {s.card for s in box.slices}), (name, cname, d)
    # the sidecar's grant still names card 3, its own (identity never comes from device IDs)
    env = container_env(core_v1, namespace, "init-sidecar-app", "side")
    assert env["GPUPOOL_CARD_INDICES"] == "3" and env["GPUPOOL_CONTAINER"] == "side"




def admission_denials(log: Path, offset: int) -> dict[str, str]:
    """kubelet's "Pod admission denied" lines written after ``offset``: pod -> reason."""
    out = {}
    for line in log.read_text(errors="replace")[offset:].splitlines():
        found = re.search(r'"Pod admission denied".* pod="[^/"]+/([^"]+)" reason="([^"]+)"', line)
        if found:
            out[found.group(1)] = found.group(2)
    return out


@pytest.mark.compat
def test_kubelet_restart_readmits_every_pod_in_one_batch_without_allocate(
    core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet,
    start_node_agent: Callable[..., NodeAgentProcess],
) -> None:
    """G7 and G1's batches. (1) kubelet restarts under a running agent: it re-admits every pod from
    its checkpoint in one batch and no Allocate reaches the agent (its counters do not move).
    (2) kubelet restarts while the agent is down, and one more pod is bound meanwhile: kubelet
    re-admits before any plugin registered again; the running pods keep their devices, the pod
    whose GPU init container finished and the new pod are rejected (UnexpectedAdmissionError, the
    devices' health is checked first: upstream, not the agent); the restarted agent, which lost
    its served log, answers no Allocate for the old pods and maps the next ones exactly."""
    node = start_gpu_node(core_v1, start_kubelet, start_node_agent, "e2e-restart")
    pods = {
        "twin-a": [Box("main", "app", shared(0, 2048, 20))],
        "twin-b": [Box("main", "app", shared(1, 2048, 20))],
        "sidecar": [Box("side", "sidecar", shared(1, 1024, 10)), Box("main", "app", shared(1, 2048, 20))],
        "multi": [Box("worker", "app", shared(2, 2048, 20)), Box("helper", "app", shared(2, 1024, 10))],
        "whole": [Box("main", "app", (CardSlice(3, CARD_MIB, 1000, exclusive=True),))],
    }
    # a finished GPU init container: re-admitting it checks its devices' health (G7)
    with_init = [Box("warmup", "init", shared(0, 1024, 10)), Box("main", "app", shared(0, 1024, 10))]
    for name, boxes in [*pods.items(), ("with-init", with_init)]:
        create(core_v1, namespace, node, manifest(node, name, boxes))
    before = wait_running(core_v1, namespace, [*pods, "with-init"], node)
    check_grants(core_v1, namespace, node.pods)
    answered = wait_answered(node.agent, allocate_calls(node.pods.values()))
    devices_before = {k: v for k, v in pod_resources(node.kubelet).items() if k[0] == namespace}
    log = node.kubelet.kubelet.log_path

    def first_batch(offset: int) -> str | None:
        lines = [ln for ln in log.read_text(errors="replace")[offset:].splitlines()
                 if "SyncLoop ADD" in ln and f"{namespace}/" in ln]
        return lines[0] if lines else None

    def unchanged(names: Iterable[str]) -> None:
        now = wait_running(core_v1, namespace, names, node)
        for name in names:  # same containers, never restarted
            assert containers_of(now[name]) == containers_of(before[name]), name
        listed = {k: v for k, v in pod_resources(node.kubelet).items() if k[0] == namespace}
        for name in names:  # G7: the checkpointed device IDs
            assert listed[(namespace, name)] == devices_before[(namespace, name)], name

    # (1) the agent keeps running across the restart
    offset = log.stat().st_size
    node.kubelet.restart()
    batch = wait_for(lambda: first_batch(offset), timeout=30, what=f"kubelet's first ADD\n{log_tail(log)}")
    assert all(f"{namespace}/{name}" in batch for name in [*pods, "with-init"]), batch  # G1: one batch
    wait_devices(core_v1, node)
    denied = admission_denials(log, offset)
    # the plugins usually register before kubelet re-admits (0.2 s poll; kubelet's sync loop
    # starts about 1 s after kubelet.sock), else with-init is rejected as in (2): a race
    assert set(denied) <= {"with-init"}, denied
    kept = [*pods] if denied else [*pods, "with-init"]
    unchanged(kept)
    time.sleep(1)
    assert counters(node.agent) == answered, "an Allocate reached the agent after the restart"
    print(f"\n  restart under a running agent: with-init {'rejected: ' + denied['with-init'] if denied else 'kept'}")

    # (2) the agent is down across the restart; a pod is bound meanwhile
    node.agent.stop()
    offset = log.stat().st_size
    node.kubelet.kubelet.stop()
    create(core_v1, namespace, node, manifest(node, "bound-while-down", [Box("main", "app", shared(2, 1024, 10))]))
    node.kubelet.restart()
    batch = wait_for(lambda: first_batch(offset), timeout=30, what=f"kubelet's first ADD\n{log_tail(log)}")
    assert all(f"{namespace}/{name}" in batch for name in [*kept, "bound-while-down"]), batch
    rejected = {n for n in ("with-init", "bound-while-down") if n in kept or n == "bound-while-down"}
    denied = wait_for(lambda: (lambda d: d if set(d) >= rejected else None)(admission_denials(log, offset)),
                      timeout=30, what=f"kubelet rejecting {sorted(rejected)}\n{log_tail(log)}")
    assert denied == dict.fromkeys(rejected, "UnexpectedAdmissionError"), denied
    # A rejected pod ends terminal: kubelet kills what still runs. The phase comes from the
    # containers' exits (the fake runtime reports 0 for a stopped container: Succeeded; runc 137).
    wait_for(lambda: all(phases(core_v1, namespace)[n].status.phase in ("Failed", "Succeeded") for n in rejected),
             timeout=30, what=f"{sorted(rejected)} terminal")
    assert phases(core_v1, namespace)["bound-while-down"].status.reason == "UnexpectedAdmissionError"
    node.agent.start()
    wait_devices(core_v1, node)
    unchanged(pods)
    time.sleep(1)
    assert counters(node.agent).answered == 0  # G7: the restarted agent saw no Allocate

    # then new pods map exactly, the agent knowing earlier grants only from PodResources/allocated-v1
    later = {"twin-c": [Box("main", "app", shared(0, 2048, 20))],
             "sidecar-2": [Box("side", "sidecar", shared(2, 1024, 10)), Box("main", "app", shared(2, 1024, 10))]}
    new = {n: manifest(node, n, b) for n, b in later.items()}
    for pod in new.values():
        create(core_v1, namespace, node, pod)
    wait_running(core_v1, namespace, later, node)
    check_grants(core_v1, namespace, new)
    wait_answered(node.agent, allocate_calls(new.values()))


V1_CGROUPS = Path("/sys/fs/cgroup")


@pytest.fixture
def pod_cgroups() -> Iterator[Callable[[str], dict[str, Any]]]:
    """kubelet configuration with pod cgroups (``cgroupsPerQOS``) under a private cgroup root.

    The test environment's kubelets run without pod cgroups (``cgroupsPerQOS: false``); kubelet
    1.35-1.37 then crash actuating an in-place resize (``doPodResizeAction`` dereferences the nil
    cgroup config of the no-op pod container manager). With pod cgroups kubelet writes the resized
    values into ``<root>/kubepods/...`` (the fake runtime runs no process in them); each root is
    removed, bottom-up, after the test. The test asks for this fixture before ``start_kubelet``, so
    it is torn down after the kubelet stopped: a running kubelet keeps its pod cgroups (they were
    left behind on the machine when the roots went first).
    """
    roots: list[str] = []

    def config(node_name: str) -> dict[str, Any]:
        root = f"/gpupool-e2e-{node_name}"
        for hierarchy in sorted(p for p in V1_CGROUPS.iterdir() if p.is_dir() and p.name != "unified"):
            path = hierarchy / root.lstrip("/")
            path.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):  # an empty cpuset admits no child
                if (hierarchy / knob).exists() and not (path / knob).read_text().strip():
                    (path / knob).write_text((hierarchy / knob).read_text())
        roots.append(root)
        return {"cgroupsPerQOS": True, "cgroupRoot": root}

    yield config
    for root in roots:
        for hierarchy in V1_CGROUPS.iterdir():
            top = hierarchy / root.lstrip("/")
            if top.is_dir():
                for sub in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                    sub.rmdir()
                top.rmdir()


@pytest.mark.compat
def test_in_place_resize_of_a_running_gpu_pod_calls_no_allocate(
    pod_cgroups: Callable[[str], dict[str, Any]], core_v1: client.CoreV1Api, namespace: str,
    start_kubelet: StartKubelet, start_node_agent: Callable[..., NodeAgentProcess],
) -> None:
    """G6: a CPU resize through the ``resize`` subresource; kubelet admits it (1.37: the device
    manager returns at once for a resize; 1.35: it finds every device recorded) and actuates it
    (the pod's cgroup), and no Allocate reaches the agent: same container, same device IDs, same
    grant. The next pod of the same shape maps exactly."""
    node = start_gpu_node(core_v1, start_kubelet, start_node_agent, "e2e-resize", config=pod_cgroups)
    kubelet = node.kubelet
    shape = [Box("main", "app", shared(2, 4096, 30))]
    create(core_v1, namespace, node, manifest(node, "resized", shape, cpu="100m"))
    [before] = wait_running(core_v1, namespace, ["resized"], node).values()
    check_grants(core_v1, namespace, node.pods)
    answered = wait_answered(node.agent, allocate_calls(node.pods.values()))
    devices = pod_resources(node.kubelet)[(namespace, "resized")]
    env = container_env(core_v1, namespace, "resized", "main")
    allocated = before.metadata.annotations[NAMES.allocated]
    shares = V1_CGROUPS / "cpu" / kubelet.extra_config["cgroupRoot"].lstrip("/") / "kubepods" / "burstable" / (
        f"pod{before.metadata.uid}") / "cpu.shares"
    assert shares.read_text().strip() == "102"  # 100m

    core_v1.patch_namespaced_pod_resize(
        "resized", namespace,
        [{"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "200m"}],
        _content_type="application/json-patch+json")

    def resized() -> client.V1Pod | None:
        assert node.kubelet.kubelet.alive(), log_tail(node.kubelet.kubelet.log_path)
        pod = core_v1.read_namespaced_pod("resized", namespace)
        conditions = {c.type: c for c in pod.status.conditions or []}
        assert "PodResizePending" not in conditions, conditions["PodResizePending"]
        [status] = pod.status.container_statuses
        requests = (status.resources.requests if status.resources else None) or {}
        done = ((status.allocated_resources or {}).get("cpu") == "200m" and requests.get("cpu") == "200m"
                and "PodResizeInProgress" not in conditions
                and pod.status.observed_generation == pod.metadata.generation)
        return pod if done else None

    after = wait_for(resized, timeout=30, what=f"the resize actuated\n{log_tail(node.kubelet.kubelet.log_path)}")
    assert shares.read_text().strip() == "204"  # 200m, in the pod's cgroup
    assert containers_of(after) == containers_of(before)  # resized in place, not restarted
    assert pod_resources(node.kubelet)[(namespace, "resized")] == devices
    time.sleep(1)
    assert counters(node.agent) == answered, "the resize reached the agent"
    assert container_env(core_v1, namespace, "resized", "main") == env
    assert after.metadata.annotations[NAMES.allocated] == allocated

    twin = manifest(node, "twin", [Box("main", "app", shared(3, 4096, 30))], cpu="100m")
    create(core_v1, namespace, node, twin)
    wait_running(core_v1, namespace, ["twin"], node)
    check_grants(core_v1, namespace, {"twin": twin})
    wait_answered(node.agent, answered.answered + allocate_calls([twin]))


def generated(node: GpuNode, count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` pods placed on ``node``'s cards by the allocation core
    (:func:`gpupool.testing.node_workload.generate`: slices, two GPU containers beside a GPU-less
    one, GPU init + app, GPU init + native sidecar + app, GPU sidecars, whole cards), as manifests
    for the real kubelet."""
    _gpus, pods = generate(count, cards=len(node.gpus["cards"]), seed=seed, node=node.name)
    out = []
    for w in pods:
        spec = w.json["spec"]

        def real(c: dict[str, Any], init: bool) -> dict[str, Any]:
            done = init and c.get("restartPolicy") != "Always"
            return {**c, "image": IMAGE, "command": ["true"] if done else ["sleep", "3600"],
                    "resources": {"limits": {k: str(v) for k, v in c["resources"]["limits"].items()}}}

        out.append({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": w.json["metadata"]["name"],
                                 "annotations": w.json["metadata"]["annotations"]},
                    "spec": {"nodeName": node.name, "terminationGracePeriodSeconds": 1,
                             "initContainers": [real(c, True) for c in spec["initContainers"]],
                             "containers": [real(c, False) for c in spec["containers"]]}})
    return out


def test_200_pods_created_concurrently_on_one_kubelet_each_get_their_own_grant(
    core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet,
    start_node_agent: Callable[..., NodeAgentProcess],
) -> None:
    """G1-G4 under load on the real kubelet: 200 pods placed by the allocation core on 16 cards,
    shuffled and created in random batches of 1-12 by eight threads at once (kubelet admits them
    one ADD at a time, in whatever order its watch delivers them)."""
    began = time.monotonic()
    gpus = generate(1, cards=16, seed=0)[0]
    node = start_gpu_node(core_v1, start_kubelet, start_node_agent, "e2e-load", gpus,
                          config=lambda _: {"maxPods": 250})  # 110 by default
    ready = time.monotonic()
    pods = generated(node, 200, seed=11)
    rng = random.Random(7)
    rng.shuffle(pods)
    batches, i = [], 0
    while i < len(pods):
        n = rng.randint(1, 12)
        batches.append(pods[i:i + n])
        i += n

    def create_batch(batch: list[dict[str, Any]]) -> None:
        for pod in batch:
            create(core_v1, namespace, node, pod)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create_batch, batches))
    created = time.monotonic()
    # Generous: the whole test took 82-120 s in CI runs, and the wait timed out at 120 s twice with the
    # machine loaded; what it proves is the grants, not how soon 200 pods run (it prints how long).
    wait_running(core_v1, namespace, node.pods, node, timeout=300)
    running = time.monotonic()

    checked = check_grants(core_v1, namespace, node.pods)  # env and allocated-v1 == assignment
    wait_answered(node.agent, allocate_calls(node.pods.values()))  # one per (container, resource)
    listed = {k: v for k, v in pod_resources(node.kubelet).items() if k[0] == namespace}
    assert {name for _, name in listed} == set(node.pods)  # G3: every pod, nothing else
    every = [i for cs in listed.values() for d in cs.values() for ids in ours(d).values() for i in ids]
    assert len(every) == len(set(every))  # G4: no ID held by two listed containers
    for (_ns, name), cs in listed.items():  # one device per unit of each limit
        limits = dict(gpu_containers(node.pods[name]))
        for cname, d in cs.items():
            assert {r: len(ids) for r, ids in ours(d).items()} == {
                r: int(v) for r, v in limits.get(cname, {}).items() if int(v) > 0}, (name, cname)
    print(f"\n  200 pods, {checked} GPU containers: node ready {ready - began:.1f} s, created "
          f"{created - ready:.1f} s, all Running {running - created:.1f} s, checks {time.monotonic() - running:.1f} s")
