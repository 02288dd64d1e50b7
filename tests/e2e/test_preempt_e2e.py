"""A high-priority GPU pod preempts low-priority shares through the real kube-scheduler.

The scheduler runs the shipped deploy/scheduler-config-v1-prioritize.yaml (its ``preemptVerb``
included; only connection details change, see test_scheduler_config_e2e.py) against the real
``gpupool extender`` process. The node is a kubelet-less Node object whose two cards are held by
low-priority pods. kube-scheduler cannot see gpupool's resources (``ignoredByScheduler``): its dry
run proposes only the victims its own resources need (here the pod holding the CPU the preemptor
asks for), and the extender's preempt adds the pod whose card frees enough; kube-scheduler deletes
both, and the high-priority pod binds to the freed card. A borrower holds nothing the pod needs (it
counts against a loan), so nobody is evicted for it.

The current kube-scheduler drops a node whose dry run needs no victim before it asks any extender
(``Evaluator.DryRunPreemption`` and ``callExtenders``, ``pkg/scheduler/framework/preemption``): a pod
that lacks only GPU room is not preempted for. ``test_a_pod_that_lacks_only_gpu_room_is_not_preempted_for``
pins that limit (docs/extender.md, "Preemption").

kube-scheduler retries the preemptor on the victim's delete, which may come before the extender's
own watch has released the victim; with an extender that reads the API through a lagging proxy
(tests/e2e/lagging_proxy.py) it always does. The extender then asks for the retry itself
(gpupool/extender/requeue.py) and names no further victims meanwhile.

The kube-scheduler is the stock one of the release under test (v1.20.0-v1.20.9 never called an
extender's preempt verb, kubernetes#102971; every supported release does, docs/extender.md
"Preemption").
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpupool.api.annotations import Inventory, decode_assignment, encode_inventory
from gpupool.api.names import NVIDIA_GPUMEM, ResourceNames
from gpupool.core.model import GpuCard
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.paths import Binaries
from tests.e2e.e2e_support import ExtenderProcess, MakeNode, make_priority_classes, wait_for
from tests.e2e.lagging_proxy import LaggingProxy
from tests.e2e.test_extender_e2e import placed_pod
from tests.e2e.test_scheduler_config_e2e import run_scheduler

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
CARD = 16276
LOW, HIGH = 100, 100000
BORROWED = "gpupool.io/borrowed"
#: How long the preemptor may take to bind: well under a second, and a few seconds when
#: kube-scheduler retries it before the extender's watch has released the victim (the extender then
#: nudges it, docs/extender.md "Preemption"); kube-scheduler v1.20's own retry would take 60-90 s.
BIND_TIMEOUT_S = 30
LAG_S = 1.0
"""How late the lagging extender hears from the API (kube-scheduler retries within ~0.1 s)."""


@pytest.fixture
def priority_classes(kube_api_client: client.ApiClient) -> Iterator[tuple[str, str]]:
    with make_priority_classes(kube_api_client, "gpupool", LOW, HIGH) as names:
        yield names


@pytest.fixture
def lagging_extender(control_plane: ControlPlane, tmp_path: Path) -> Iterator[ExtenderProcess]:
    """The extender reading the API through a proxy that holds every answer for :data:`LAG_S`
    (tests/e2e/lagging_proxy.py): kube-scheduler always hears of an eviction first."""
    server = urllib.parse.urlsplit(control_plane.server)
    proxy = LaggingProxy(server.port or 443, LAG_S).start()
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    kubeconfig = tmp_path / "kubeconfig-lagging"
    kubeconfig.write_text(yaml.safe_dump(config))
    process = ExtenderProcess(kubeconfig, tmp_path / "extender.log")
    process.start()
    try:
        yield process
    finally:
        process.kill()
        proxy.stop()


#: The low-priority pods (card, MiB, borrower?): ``a`` also holds the CPU the preemptor needs
#: (:data:`HELD_CPU`), so kube-scheduler's dry run proposes it; evicting it frees no card big enough,
#: so the extender must add ``b`` (card 0 then frees) or ``c`` (card 1).
HELD = {"a": (0, 8000, False), "b": (0, 8000, False), "c": (1, 12000, False)}
HELD_CPU = {"a": "3"}
NODE_CPU = "4"
URGENT_CPU = "2"


@pytest.mark.compat
def test_high_priority_gpu_pod_evicts_the_cpu_victim_and_the_share_that_frees_its_card(
    testenv_binaries: Binaries, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
    make_node: MakeNode, priority_classes: tuple[str, str], extender_process: ExtenderProcess, tmp_path: Path,
) -> None:
    cluster = Cluster(testenv_binaries, control_plane, core_v1, namespace, make_node, priority_classes, tmp_path)
    cluster.preempt(extender_process)


def test_a_pod_that_lacks_only_gpu_room_is_not_preempted_for(
    testenv_binaries: Binaries, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
    make_node: MakeNode, priority_classes: tuple[str, str], extender_process: ExtenderProcess, tmp_path: Path,
) -> None:
    """The limit of preemption through the current kube-scheduler: with CPU to spare, its dry run
    finds the pod fits without victims, drops the node, and never asks the extender; the pod stays
    Pending and nobody is evicted."""
    cluster = Cluster(testenv_binaries, control_plane, core_v1, namespace, make_node, priority_classes, tmp_path)
    node = cluster.node_held(extender_process, HELD)
    wait_for(lambda: not extender_process.passes(probe(12000), [node]) or None, timeout=20,
             what="the extender books the low-priority shares")
    scheduler = cluster.start_scheduler(extender_process)
    try:
        cluster.create_urgent(node, scheduler_name=scheduler[1])
        wait_for(lambda: _unschedulable(core_v1, namespace, "urgent"), timeout=BIND_TIMEOUT_S,
                 what="kube-scheduler marking the pod unschedulable")
        time.sleep(3)  # a further cycle or two: nothing changes
        assert core_v1.read_namespaced_pod("urgent", namespace).spec.node_name is None
    finally:
        scheduler[0].stop()
    assert cluster.left() == set(HELD) | {"urgent"}
    assert extender_process.metric("gpupool_extender_requests_total", outcome="ok", verb="preempt") == 0


def _unschedulable(core_v1: client.CoreV1Api, namespace: str, name: str) -> bool:
    conditions = core_v1.read_namespaced_pod(name, namespace).status.conditions or []
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" for c in conditions)


def test_the_preemptor_binds_at_once_when_the_extender_hears_of_the_eviction_late(
    testenv_binaries: Binaries, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
    make_node: MakeNode, priority_classes: tuple[str, str], lagging_extender: ExtenderProcess, tmp_path: Path,
) -> None:
    """kube-scheduler retries the preemptor on the victim's delete before the lagging extender has
    released the victim's cards: the filter refuses, and kube-scheduler v1.20 would retry only at
    its 60 s flush. The extender's nudge (gpupool/extender/requeue.py) has it retried as soon as
    the watch catches up."""
    cluster = Cluster(testenv_binaries, control_plane, core_v1, namespace, make_node, priority_classes, tmp_path)
    took = cluster.preempt(lagging_extender)
    assert "asked kube-scheduler to retry" in lagging_extender.log_path.read_text(), took


def test_a_borrower_never_needs_preempting(
    testenv_binaries: Binaries, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
    make_node: MakeNode, priority_classes: tuple[str, str], extender_process: ExtenderProcess, tmp_path: Path,
) -> None:
    """A borrower (``gpupool.io/borrowed``) counts against its card's loan, never against the
    owners' capacity (docs/lending.md): a high-priority pod that needs the borrower's card binds
    beside it with nobody evicted (the node agent reclaims the borrower when the pod opens the card)."""
    cluster = Cluster(testenv_binaries, control_plane, core_v1, namespace, make_node, priority_classes, tmp_path)
    node = cluster.node_held(extender_process, {"a": (0, 8000, False), "c": (1, 8000, True)})
    barrier = f"barrier-{uuid.uuid4().hex[:6]}"  # a pod created after c: once it is booked, so is c
    make_node(barrier, {"cpu": "64", "memory": "256Gi", "pods": "250", NVIDIA_GPUMEM: "1"}, annotations={
        NAMES.inventory: encode_inventory(Inventory((GpuCard(0, f"GPU-{barrier}-0", "Tesla-P100", CARD),)))})
    wait_for(lambda: extender_process.passes(probe(12000), [barrier]) or None, timeout=20,
             what="the extender knows the barrier node")
    core_v1.create_namespaced_pod(namespace, placed_pod("full", barrier, 0, CARD))
    wait_for(lambda: not extender_process.passes(probe(12000), [barrier]) or None, timeout=20,
             what="the extender books the pods")
    cluster.schedule_urgent(extender_process, node, BIND_TIMEOUT_S, cpu="10m")
    assert extender_process.metric("gpupool_extender_requests_total", outcome="ok", verb="preempt") == 0
    assert cluster.left() == {"a", "c", "full", "urgent"} and cluster.urgent_cards() == [1]


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What a preemption through the real kube-scheduler needs."""

    binaries: Binaries
    control_plane: ControlPlane
    core_v1: client.CoreV1Api
    namespace: str
    make_node: MakeNode
    priority_classes: tuple[str, str]
    tmp_path: Path

    def preempt(self, extender: ExtenderProcess, timeout: float = BIND_TIMEOUT_S) -> float:
        """One node whose two cards are held by the low-priority pods of :data:`HELD`; a
        high-priority pod needing CPU that only ``a`` holds, and 12000 MiB of one card. kube-scheduler
        proposes ``a``; the extender keeps it and adds one share that frees a card. Returns the
        seconds until the pod was bound."""
        node = self.node_held(extender, HELD, cpu=HELD_CPU, node_cpu=NODE_CPU)
        wait_for(lambda: not extender.passes(probe(12000), [node]) or None, timeout=20,
                 what="the extender books the low-priority shares")
        uids = {p.metadata.name: p.metadata.uid for p in self.core_v1.list_namespaced_pod(self.namespace).items}
        asked = {"Pod": {"metadata": {"name": "x", "namespace": self.namespace, "uid": "x"},
                         "spec": {"priority": HIGH, "containers": [
                             {"name": "main", "resources": {"limits": {NVIDIA_GPUMEM: "12000"}}}]}},
                 "NodeNameToMetaVictims": {node: {"Pods": [{"UID": uids["a"]}]}}}
        answer = post(extender, "preempt", asked)["NodeNameToMetaVictims"]
        named = {p["UID"] for p in answer[node]["Pods"]}
        assert uids["a"] in named and len(named) == 2 and named < {uids[n] for n in HELD}, answer
        took = self.schedule_urgent(extender, node, timeout, cpu=URGENT_CPU)
        assert extender.metric("gpupool_extender_requests_total", outcome="ok", verb="preempt") >= 2
        left = self.left()
        gone = set(HELD) - left
        assert "a" in gone and len(gone) == 2 and "urgent" in left, left  # a, and one share that frees a card
        (share,) = gone - {"a"}
        assert self.urgent_cards() == [HELD[share][0]]
        return took

    def node_held(self, extender: ExtenderProcess, held: dict[str, tuple[int, int, bool]], *,
                  cpu: dict[str, str] | None = None, node_cpu: str = "64") -> str:
        """A node with two cards and ``node_cpu`` cores, and on it the low-priority pods of ``held``
        (card, MiB, borrower?), those named in ``cpu`` requesting that much CPU."""
        node = f"preempt-{uuid.uuid4().hex[:6]}"
        cards = tuple(GpuCard(i, f"GPU-{node}-{i}", "Tesla-P100", CARD) for i in range(2))
        self.make_node(node, {"cpu": node_cpu, "memory": "256Gi", "pods": "250", NVIDIA_GPUMEM: "1"},
                       annotations={NAMES.inventory: encode_inventory(Inventory(cards))})
        wait_for(lambda: extender.passes(probe(12000), [node]) or None, timeout=20,
                 what="the extender knows the node")
        for name, (card, mib, borrowed) in held.items():
            manifest = with_priority(placed_pod(name, node, card, mib), self.priority_classes[0])
            if borrowed:
                manifest["metadata"]["annotations"][BORROWED] = "true"
            if cpu and name in cpu:
                manifest["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu[name]}
            self.core_v1.create_namespaced_pod(self.namespace, manifest)
        assert {self.core_v1.read_namespaced_pod(n, self.namespace).spec.priority for n in held} == {LOW}
        return node

    def start_scheduler(self, extender: ExtenderProcess) -> tuple[Any, str]:
        """kube-scheduler with the shipped configuration under a name of its own, and that name."""
        scheduler_name = f"gpupool-preempt-{uuid.uuid4().hex[:6]}"
        return run_scheduler(self.binaries, self.control_plane, self.tmp_path, extender.url,
                             scheduler_name), scheduler_name

    def create_urgent(self, node: str, *, scheduler_name: str, cpu: str = "10m") -> None:
        """The high-priority pod asking 12000 MiB and ``cpu``, pinned to ``node``."""
        wanted = with_priority(placed_pod("urgent", node, 0, 12000), self.priority_classes[1])
        wanted["spec"].pop("nodeName")
        wanted["metadata"]["annotations"] = {}
        wanted["spec"]["schedulerName"] = scheduler_name
        wanted["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        wanted["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
        self.core_v1.create_namespaced_pod(self.namespace, wanted)
        assert self.core_v1.read_namespaced_pod("urgent", self.namespace).spec.priority == HIGH

    def schedule_urgent(self, extender: ExtenderProcess, node: str, timeout: float, *, cpu: str) -> float:
        """The high-priority pod (:meth:`create_urgent`) through kube-scheduler; the seconds until it
        was bound to ``node``."""
        scheduler, scheduler_name = self.start_scheduler(extender)
        try:
            self.create_urgent(node, scheduler_name=scheduler_name, cpu=cpu)
            started = time.monotonic()
            bound = wait_for(lambda: self.core_v1.read_namespaced_pod("urgent", self.namespace).spec.node_name,
                             timeout=timeout, what="the high-priority pod bound")
            took = time.monotonic() - started
        finally:
            scheduler.stop()
        assert bound == node
        return took

    def left(self) -> set[str]:
        """The pods of the namespace not being deleted."""
        return {p.metadata.name for p in self.core_v1.list_namespaced_pod(self.namespace).items
                if p.metadata.deletion_timestamp is None}

    def urgent_cards(self) -> list[int]:
        pod = self.core_v1.read_namespaced_pod("urgent", self.namespace)
        assignment = decode_assignment(pod.metadata.annotations[NAMES.assignment])
        return [c.index for c in assignment.containers[0].cards]


@pytest.mark.parametrize("lagging", [
    pytest.param(False, id="evicts-one-holder"),
    pytest.param(True, id="evicts-one-holder-when-the-extender-lags"),
])
def test_a_gpu_pod_that_could_preempt_on_two_nodes(
    request: pytest.FixtureRequest, testenv_binaries: Binaries, control_plane: ControlPlane,
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, priority_classes: tuple[str, str],
    tmp_path: Path, lagging: bool,
) -> None:
    """Two nodes, each card held by one low-priority pod that also holds the CPU the preemptor
    needs. kube-scheduler's dry run proposes each holder and asks the extender, which confirms them;
    kube-scheduler picks one node and evicts its holder. When
    kube-scheduler retries the pod before the extender has seen that eviction (always, with the
    lagging extender), the filter still refuses both nodes, and a second answer would evict the
    other holder too: the extender names nobody while the first holder's eviction is under way."""
    binaries = testenv_binaries
    extender_process: ExtenderProcess = request.getfixturevalue("lagging_extender" if lagging else "extender_process")
    low, high = priority_classes
    nodes = [f"pair-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for node in nodes:
        card = GpuCard(0, f"GPU-{node}-0", "Tesla-P100", CARD)
        make_node(node, {"cpu": NODE_CPU, "memory": "256Gi", "pods": "250", NVIDIA_GPUMEM: "1"},
                  annotations={NAMES.inventory: encode_inventory(Inventory((card,)))})
    # one node at a time: the filter passes one of several equally good nodes (--filter-one-best)
    wait_for(lambda: all(extender_process.passes(probe(12000), [node]) == [node] for node in nodes) or None,
             timeout=20, what="the extender knows the nodes")
    for node in nodes:
        held_pod = with_priority(placed_pod(f"held-{node}", node, 0, 12000), low)
        held_pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": HELD_CPU["a"]}
        core_v1.create_namespaced_pod(namespace, held_pod)
    wait_for(lambda: not extender_process.passes(probe(12000), nodes) or None, timeout=20,
             what="the extender books the low-priority pods")
    scheduler_name = f"gpupool-pair-{uuid.uuid4().hex[:6]}"
    scheduler = run_scheduler(binaries, control_plane, tmp_path, extender_process.url, scheduler_name)
    try:
        wanted = with_priority(placed_pod("urgent", nodes[0], 0, 12000), high)
        wanted["spec"].pop("nodeName")
        wanted["metadata"]["annotations"] = {}
        wanted["spec"]["schedulerName"] = scheduler_name
        wanted["spec"]["containers"][0]["resources"]["requests"] = {"cpu": URGENT_CPU}
        core_v1.create_namespaced_pod(namespace, wanted)
        urgent = lambda: core_v1.read_namespaced_pod("urgent", namespace)  # noqa: E731
        bound = wait_for(lambda: urgent().spec.node_name, timeout=BIND_TIMEOUT_S,
                         what="the pod bound after preemption")
    finally:
        scheduler.stop()
    held = {p.metadata.name for p in core_v1.list_namespaced_pod(namespace).items
            if p.metadata.deletion_timestamp is None and p.metadata.name != "urgent"}
    assert held == {f"held-{n}" for n in nodes if n != bound}


def with_priority(pod: dict[str, Any], priority_class: str) -> dict[str, Any]:
    pod["spec"]["priorityClassName"] = priority_class
    return pod


def probe(mib: int) -> dict[str, Any]:
    return {"metadata": {"name": "probe", "namespace": "default", "uid": "probe"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {NVIDIA_GPUMEM: str(mib)}}}]}}


def post(extender: ExtenderProcess, verb: str, body: dict[str, Any]) -> Any:
    """One verb asked of the extender process directly, as kube-scheduler would."""
    request = urllib.request.Request(f"{extender.url}/{verb}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read())
