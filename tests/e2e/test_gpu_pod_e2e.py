"""GPU pods end to end: kube-scheduler + gpupool extender + a real kubelet + ``gpupool node-agent``.

Every piece runs as in a cluster (the test environment's Kubernetes, v1.37.2): kube-scheduler calls the
extender (a ``gpupool extender`` process) for gpupool's resources, the extender writes
``assignment-v1`` and binds, kubelet admits the pod and calls the node agent's device plugins
(``gpupool node-agent --fake-gpus``, registered through the kubelet's host paths), the agent maps
each Allocate to its container, answers with the container's cards and writes ``allocated-v1``,
and the fake container runtime prints each container's env to its log, which we read back through
the apiserver (``kubectl logs``).

What it proves: pods of every shape reach Running with exactly their assigned cards and limits in
their env (two slices that each span the same two cards, a foreign gpushare alias served with
``--serve-aliases gpushare``, an init container that finishes before its app container starts,
each with its own grant); a pod asking for an alias no node serves stays Pending with the
extender's reason; the node agent re-registers after a kubelet restart and later pods run while
the earlier ones keep running; and everything the test started (processes, mounts, node) is gone
at the end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.annotations import (
    AnnotationError,
    Assignment,
    decode_allocated,
    decode_assignment,
    decode_inventory,
)
from gpupool.api.names import ALIYUN_GPU_MEM, TENCENT_VCUDA_CORE, TENCENT_VCUDA_MEMORY, ResourceNames
from gpupool.core.model import GpuCard, NodeSpec
from gpupool.testenv.kubelet import Kubelet
from tests.e2e.e2e_support import (
    GRANT_KEYS,
    ContainerLimits,
    ExtenderProcess,
    NodeAgentProcess,
    StartKubelet,
    env_from_log,
    expected_grant,
    gpu_pod_manifest,
    log_tail,
    wait_for,
)

# Also in the compatibility set run on the oldest supported Kubernetes minor (scripts/test-all).
pytestmark = [pytest.mark.e2e, pytest.mark.compat]

NAMES = ResourceNames()
CARD_MIB = 16384
CARDS = 3
GPUS = f"""\
model: Tesla-T4
cards:
  - {{uuid: GPU-e2e-0000, memoryMiB: {CARD_MIB}}}
  - {{uuid: GPU-e2e-0001, memoryMiB: {CARD_MIB}}}
  - {{uuid: GPU-e2e-0002, memoryMiB: {CARD_MIB}}}
topology: [[0, 1, 2]]
"""
#: The node agent also serves gpushare's resource, as on a node migrated from it.
AGENT_ARGS = ("--serve-aliases", "gpushare")


def shared(mem_units: int, percent: int, cards: int = 1) -> dict[str, str]:
    """A slice of ``cards`` cards: ``mem_units`` x 256 MiB and ``percent`` % of the compute of each."""
    limits = {NAMES.gpu_mem: str(mem_units), NAMES.gpu_core: str(percent)}
    if cards > 1:
        limits[NAMES.gpu_shared] = str(cards)
    return limits


WHOLE = {NAMES.gpu: "1"}


def wait_gpu_node(core_v1: client.CoreV1Api, kubelet: Kubelet, agent: NodeAgentProcess) -> None:
    """Until the node advertises the agent's devices and publishes its inventory."""
    def ready() -> bool:
        assert agent.running(), agent.log()
        node = core_v1.read_node(kubelet.node_name)
        allocatable = node.status.allocatable or {}
        text = (node.metadata.annotations or {}).get(NAMES.inventory)
        units = CARD_MIB // 256
        return (allocatable.get(NAMES.gpu) == str(CARDS) and allocatable.get(NAMES.gpu_mem) == str(CARDS * units)
                and allocatable.get(NAMES.gpu_shared) == str(CARDS * (units + 100))
                and allocatable.get(ALIYUN_GPU_MEM) == str(CARDS * CARD_MIB // 1024)
                and text is not None and len(decode_inventory(text).cards) == CARDS)

    wait_for(ready, timeout=60, what=f"gpupool devices and inventory on {kubelet.node_name}:\n{agent.log()}")


def running(core_v1: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    pod = core_v1.read_namespaced_pod(name, namespace)
    if pod.status.phase == "Failed":
        raise AssertionError(f"{name} failed: {pod.status.reason}: {pod.status.message}")
    return pod if pod.status.phase == "Running" else None


def assignments_text(core_v1: client.CoreV1Api, namespace: str) -> str:
    """Each pod's assignment annotation, one line each (for a failure's message)."""
    return "\n".join(f"  {p.metadata.name}: {(p.metadata.annotations or {}).get(NAMES.assignment)}"
                     for p in core_v1.list_namespaced_pod(namespace).items)


def unschedulable(core_v1: client.CoreV1Api, namespace: str, name: str) -> str | None:
    """The scheduler's message once it has marked the pod unschedulable."""
    pod = core_v1.read_namespaced_pod(name, namespace)
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return str(cond.message)
    return None


def container_env(core_v1: client.CoreV1Api, namespace: str, pod: str, container: str) -> dict[str, str]:
    """The env the runtime started ``container`` with, from its log (apiserver -> kubelet)."""
    def read() -> dict[str, str] | None:
        env = env_from_log(str(core_v1.read_namespaced_pod_log(pod, namespace, container=container)))
        return env or None

    return wait_for(read, timeout=30, what=f"log of {pod}/{container}")


def check_pod(core_v1: client.CoreV1Api, namespace: str, name: str, node: str,
              containers: list[ContainerLimits], *, started: set[str] | None = None) -> Assignment:
    """The pod's assignment matches its limits, each started container's env is exactly its
    assignment, and ``allocated-v1`` records the same cards for every GPU container."""
    pod = core_v1.read_namespaced_pod(name, namespace)
    notes = pod.metadata.annotations or {}
    assignment = decode_assignment(notes[NAMES.assignment])
    assert assignment.node == node == pod.spec.node_name
    by_name = {c.name: c for c in assignment.containers}
    for cname, limits in containers:
        if not limits:
            assert cname not in by_name
            continue
        cards = by_name[cname].cards
        if NAMES.gpu in limits:
            assert len(cards) == int(limits[NAMES.gpu]) and all(c.exclusive for c in cards)
            assert all(c.memory_mib == CARD_MIB for c in cards)
        else:
            mib = int(limits.get(NAMES.gpu_mem, "0")) * 256 or int(limits.get(ALIYUN_GPU_MEM, "0")) * 1024
            per_card = (mib, int(limits.get(NAMES.gpu_core, "0")) * 10)
            count = int(limits.get(NAMES.gpu_shared, "1"))
            assert [(c.memory_mib, c.compute) for c in cards] == [per_card] * count
            assert len({c.index for c in cards}) == count
    for cname, limits in containers:
        if started is not None and cname not in started:
            continue
        env = container_env(core_v1, namespace, name, cname)
        if limits:
            got = {k: env.get(k) for k in GRANT_KEYS}
            assert got == expected_grant(namespace, name, cname, by_name[cname].cards), (name, cname)
        else:
            assert not set(GRANT_KEYS) & set(env), (name, cname, env)  # no GPU, no grant

    def allocated() -> dict[str, list[tuple[int, str, int, int]]] | None:
        text = (core_v1.read_namespaced_pod(name, namespace).metadata.annotations or {}).get(NAMES.allocated)
        if text is None:
            return None
        try:
            value = decode_allocated(text)
        except AnnotationError as exc:
            raise AssertionError(f"{name}: allocated-v1 unreadable: {exc}") from None
        assert value.node == node
        got = {c.name: [(r.index, r.uuid, r.memory_mib, r.compute) for r in c.cards] for c in value.containers}
        return got if set(got) == set(by_name) else None

    recorded = wait_for(allocated, timeout=30, what=f"allocated-v1 on {name} for every GPU container")
    assert recorded == {c.name: [(r.index, r.uuid, r.memory_mib, r.compute) for r in c.cards]
                        for c in assignment.containers}
    return assignment


def check_agent_metrics(core_v1: client.CoreV1Api, namespace: str, node: str, names: list[str],
                        agent: NodeAgentProcess) -> None:
    """The agent's ``/metrics`` shows, per card, the memory the pods' assignments book on it (by the
    extender's rule: an init container holds its cards alone, before the app containers)."""
    spec = NodeSpec(node, 0, 0, tuple(GpuCard(i, f"GPU-e2e-{i:04d}", "Tesla-T4", CARD_MIB) for i in range(CARDS)))
    booked = dict.fromkeys(range(CARDS), 0)
    for name in names:
        text = core_v1.read_namespaced_pod(name, namespace).metadata.annotations[NAMES.assignment]
        placement = decode_assignment(text).to_placement(f"{namespace}/{name}", spec, 0, 0)
        for card, (mib, _compute, _exclusive) in placement.held_per_card().items():
            booked[card] += mib
    expected = {str(card): float(mib << 20) for card, mib in booked.items()}  # the series are in bytes

    def shown() -> dict[str, float] | None:
        got = {s.labels["card"]: s.value for family in text_string_to_metric_families(agent.metrics())
               for s in family.samples if s.name == "gpupool_card_memory_allocated_bytes"}
        return got if got == expected else None

    wait_for(shown, timeout=15, what=f"the agent's metrics to show {expected}\n{agent.metrics()}")


def test_gpu_pods_run_with_their_cards_and_survive_a_kubelet_restart(
    core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet,
    start_node_agent: Callable[..., NodeAgentProcess], gpupool_extender: ExtenderProcess,
) -> None:
    timings: dict[str, float] = {}
    began = time.monotonic()
    node = f"e2e-gpu-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(node)
    agent = start_node_agent(kubelet, GPUS, AGENT_ARGS)
    wait_gpu_node(core_v1, kubelet, agent)
    timings["node ready with gpupool devices"] = time.monotonic() - began

    # A whole card first (so the binpack policy then packs every slice onto the other card).
    whole: list[ContainerLimits] = [("main", WHOLE)]
    created = time.monotonic()
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("whole", whole, node=node))
    wait_for(lambda: running(core_v1, namespace, "whole"), timeout=90, what=f"whole Running\n{agent.log()}")
    timings["whole-card pod: create to Running"] = time.monotonic() - created

    pods: dict[str, list[ContainerLimits]] = {
        "shared": [("main", shared(16, 30))],                                  # 4 GiB, 30 %
        # helper: memory only (shares compute best-effort); log-shipper: no GPU at all
        "multi": [("worker", shared(8, 20)), ("helper", {NAMES.gpu_mem: "4"}), ("log-shipper", {})],
        # two slices that each span two cards: both must pass kubelet's device admission
        "span-a": [("main", shared(8, 20, cards=2))],
        "span-b": [("main", shared(8, 20, cards=2))],
        "gpushare": [("main", {ALIYUN_GPU_MEM: "2"})],                         # 2 GiB, gpushare's unit
    }
    init: list[ContainerLimits] = [("warmup", shared(4, 10))]
    with_init: list[ContainerLimits] = [("main", shared(8, 20))]
    pods["with-init"] = with_init
    created = time.monotonic()
    for name, containers in pods.items():
        core_v1.create_namespaced_pod(namespace, gpu_pod_manifest(
            name, containers, node=node, init=init if name == "with-init" else None))
    for name in pods:
        try:
            wait_for(lambda n=name: running(core_v1, namespace, n), timeout=90,
                     what=f"{name} Running\n{agent.log()}")
        except AssertionError as failed:  # a refused Allocate: what each pod was assigned, and both logs
            extender_log = log_tail(gpupool_extender.log_path)
            raise AssertionError(f"{failed}\nassignments:\n{assignments_text(core_v1, namespace)}\n"
                                 f"node agent:\n{agent.log()}\nextender:\n{extender_log}") from None
    timings["shared, multi-card, alias and init-container pods: create to Running"] = time.monotonic() - created
    # The init container ran ("true" exits 0 in the fake runtime) before the app container started.
    [warmup] = core_v1.read_namespaced_pod("with-init", namespace).status.init_container_statuses
    assert warmup.state.terminated is not None and warmup.state.terminated.exit_code == 0, warmup.state

    # An alias this node does not serve: the extender keeps the pod off the node, with the reason.
    tencent: list[ContainerLimits] = [("main", {TENCENT_VCUDA_CORE: "10", TENCENT_VCUDA_MEMORY: "4"})]
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("tencent", tencent, node=node))
    message = wait_for(lambda: unschedulable(core_v1, namespace, "tencent"), timeout=60,
                       what="tencent pod marked unschedulable")
    assert "--serve-aliases gpumanager" in message, message

    check_pod(core_v1, namespace, "whole", node, whole)
    assignments = {name: check_pod(core_v1, namespace, name, node, containers + (init if name == "with-init" else []))
                   for name, containers in pods.items()}
    [whole_card] = decode_assignment(core_v1.read_namespaced_pod("whole", namespace)
                                     .metadata.annotations[NAMES.assignment]).containers[0].cards
    slice_cards = {c.index for a in assignments.values() for cc in a.containers for c in cc.cards}
    assert slice_cards == set(range(CARDS)) - {whole_card.index}  # no slice on the exclusive card
    spans = [{c.index for c in assignments[n].containers[0].cards} for n in ("span-a", "span-b")]
    assert spans[0] == spans[1] == slice_cards  # both multi-card slices share the same two cards
    before = {p.metadata.name: p.status.container_statuses for p in core_v1.list_namespaced_pod(namespace).items
              if p.status.phase == "Running"}
    assert set(before) == {"whole", *pods}
    check_agent_metrics(core_v1, namespace, node, ["whole", *pods], agent)

    # kubelet restarts: it wipes the plugin directory, the agent must serve and register again.
    sockets = {p.name for p in kubelet.device_plugin_dir.glob("gpupool-*.sock")}
    assert sockets == {"gpupool-gpu.sock", "gpupool-gpu-mem.sock", "gpupool-gpu-core.sock",
                       "gpupool-gpu-shared.sock", "gpupool-aliyun.com-gpu-mem.sock"}
    restarted = time.monotonic()
    kubelet.restart()
    wait_for(lambda: sockets <= {p.name for p in kubelet.device_plugin_dir.iterdir()}, timeout=60,
             what=f"plugin sockets re-created after the kubelet restart\n{agent.log()}")
    wait_gpu_node(core_v1, kubelet, agent)
    timings["kubelet restart to plugins registered again"] = time.monotonic() - restarted

    later: list[ContainerLimits] = [("main", shared(8, 10))]
    created = time.monotonic()
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("after-restart", later, node=node))
    wait_for(lambda: running(core_v1, namespace, "after-restart"), timeout=90,
             what=f"after-restart Running\n{agent.log()}")
    timings["pod after the restart: create to Running"] = time.monotonic() - created
    check_pod(core_v1, namespace, "after-restart", node, later)
    for name, statuses in before.items():
        pod = core_v1.read_namespaced_pod(name, namespace)
        assert pod.status.phase == "Running", name
        assert [(s.container_id, s.restart_count) for s in pod.status.container_statuses] == [
            (s.container_id, 0) for s in statuses], name
    assert agent.running(), agent.log()

    # Clean-up is part of the contract: the agent exits on SIGTERM, kubelet's processes, mounts,
    # directories and Node are gone.
    assert agent.stop() is not None and not agent.running()
    plugin_sockets = [kubelet.device_plugin_dir / name for name in sockets]
    kubelet.stop(delete_node=True)
    assert not kubelet.kubelet.alive() and not kubelet.fakecri.alive()
    assert not kubelet.directory.exists() and not any(p.exists() for p in plugin_sockets)
    assert str(kubelet.directory) not in Path("/proc/self/mountinfo").read_text()
    with pytest.raises(ApiException) as gone:
        core_v1.read_node(node)
    assert gone.value.status == 404
    timings["whole test"] = time.monotonic() - began
    print("\n" + "\n".join(f"  {k}: {v:.1f} s" for k, v in timings.items()))
