"""A high-priority GPU pod preempts low-priority shares through the real kube-scheduler.

The scheduler runs the shipped deploy/scheduler-config-v1beta1-prioritize.yaml (its ``preemptVerb``
and its one-candidate preemption profile included; only connection details change, see
test_scheduler_config_e2e.py) against the real ``gpupool extender`` process. The node is a
kubelet-less Node object whose two cards are held by low-priority pods. kube-scheduler cannot see
gpupool's resources (``ignoredByScheduler``), so its dry run proposes the node with no victims; the
extender's preempt names the pod whose card frees enough, kube-scheduler deletes it, and the
high-priority pod binds to the freed card while the shares on the other card stay. A borrower holds
nothing the pod needs (it counts against a loan), so nobody is evicted for it.

kube-scheduler retries the preemptor on the victim's delete, which may come before the extender's
own watch has released the victim; with an extender that reads the API through a lagging proxy
(tests/e2e/lagging_proxy.py) it always does. The extender then asks for the retry itself
(gpupool/extender/requeue.py) and names no further victims meanwhile.

The kube-scheduler is v1.20.2 with the upstream fix kubernetes#103030 (what v1.20.10 and later
ship): stock v1.20.0-v1.20.9 never call an extender's preempt verb at all
(:mod:`gpupool.testenv.scheduler_patch`, docs/extender.md "Preemption"); the last test shows what
stock v1.20.2 does instead, on two nodes.
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
from kubernetes.client.rest import ApiException

from gpupool.api.annotations import Inventory, decode_assignment, encode_inventory
from gpupool.api.names import NVIDIA_GPUMEM, ResourceNames
from gpupool.core.model import GpuCard
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.errors import BuildImpossibleError
from gpupool.testenv.paths import Binaries
from gpupool.testenv.scheduler_patch import ensure_preempting_scheduler
from tests.e2e.e2e_support import ExtenderProcess, MakeNode, wait_for
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


@pytest.fixture(scope="session")
def preempting_binaries(testenv_binaries: Binaries) -> Binaries:
    """The binaries with the kube-scheduler that calls extenders on preemption (built once, cached)."""
    try:
        scheduler = ensure_preempting_scheduler(log=print)
    except BuildImpossibleError as exc:
        pytest.skip(f"cannot build the patched kube-scheduler: {exc}")
    return dataclasses.replace(testenv_binaries, kube_scheduler=scheduler)


@pytest.fixture
def priority_classes(kube_api_client: client.ApiClient) -> Iterator[tuple[str, str]]:
    api = client.SchedulingV1Api(kube_api_client)
    tag = uuid.uuid4().hex[:6]
    names = (f"gpupool-low-{tag}", f"gpupool-high-{tag}")
    for name, value in zip(names, (LOW, HIGH), strict=True):
        api.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                   "metadata": {"name": name}, "value": value})
    try:
        yield names
    finally:
        for name in names:
            try:
                api.delete_priority_class(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


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


#: Per case: the low-priority pods (card, MiB, borrower?) and the one the extender must evict.
CASES = [
    pytest.param({"a": (0, 8000, False), "b": (0, 8000, False), "c": (1, 12000, False)}, "c",
                 id="the-share-that-frees-a-card-alone"),
]


@pytest.mark.parametrize(("held", "victim"), CASES)
def test_high_priority_gpu_pod_preempts_the_share_that_frees_its_card(
    preempting_binaries: Binaries, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
    make_node: MakeNode, priority_classes: tuple[str, str], extender_process: ExtenderProcess, tmp_path: Path,
    held: dict[str, tuple[int, int, bool]], victim: str,
) -> None:
    cluster = Cluster(preempting_binaries, control_plane, core_v1, namespace, make_node, priority_classes, tmp_path)
    cluster.preempt(extender_process, held, victim)


def test_the_preemptor_binds_at_once_when_the_extender_hears_of_the_eviction_late(
    preempting_binaries: Binaries, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
    make_node: MakeNode, priority_classes: tuple[str, str], lagging_extender: ExtenderProcess, tmp_path: Path,
) -> None:
    """kube-scheduler retries the preemptor on the victim's delete before the lagging extender has
    released the victim's cards: the filter refuses, and kube-scheduler v1.20 would retry only at
    its 60 s flush. The extender's nudge (gpupool/extender/requeue.py) has it retried as soon as
    the watch catches up."""
    cluster = Cluster(preempting_binaries, control_plane, core_v1, namespace, make_node, priority_classes, tmp_path)
    took = cluster.preempt(lagging_extender, dict(CASES[0].values[0]), "c")
    assert "asked kube-scheduler to retry" in lagging_extender.log_path.read_text(), took


def test_a_borrower_never_needs_preempting(
    preempting_binaries: Binaries, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
    make_node: MakeNode, priority_classes: tuple[str, str], extender_process: ExtenderProcess, tmp_path: Path,
) -> None:
    """A borrower (``gpupool.io/borrowed``) counts against its card's loan, never against the
    owners' capacity (docs/lending.md): a high-priority pod that needs the borrower's card binds
    beside it with nobody evicted (the node agent reclaims the borrower when the pod opens the card)."""
    cluster = Cluster(preempting_binaries, control_plane, core_v1, namespace, make_node, priority_classes, tmp_path)
    node = cluster.node_held(extender_process, {"a": (0, 8000, False), "c": (1, 8000, True)})
    barrier = f"barrier-{uuid.uuid4().hex[:6]}"  # a pod created after c: once it is booked, so is c
    make_node(barrier, {"cpu": "64", "memory": "256Gi", "pods": "250", NVIDIA_GPUMEM: "1"}, annotations={
        NAMES.inventory: encode_inventory(Inventory((GpuCard(0, f"GPU-{barrier}-0", "Tesla-P100", CARD),)))})
    wait_for(lambda: extender_process.passes(probe(12000), [barrier]) or None, timeout=20,
             what="the extender knows the barrier node")
    core_v1.create_namespaced_pod(namespace, placed_pod("full", barrier, 0, CARD))
    wait_for(lambda: not extender_process.passes(probe(12000), [barrier]) or None, timeout=20,
             what="the extender books the pods")
    cluster.schedule_urgent(extender_process, node, BIND_TIMEOUT_S)
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

    def preempt(self, extender: ExtenderProcess, held: dict[str, tuple[int, int, bool]], victim: str,
                timeout: float = BIND_TIMEOUT_S) -> float:
        """One node whose two cards are held by low-priority pods (``held``); a high-priority pod
        must evict ``victim`` alone and bind to its card. Returns the seconds until it was bound."""
        node = self.node_held(extender, held)
        wait_for(lambda: not extender.passes(probe(12000), [node]) or None, timeout=20,
                 what="the extender books the low-priority shares")
        uids = {p.metadata.name: p.metadata.uid for p in self.core_v1.list_namespaced_pod(self.namespace).items}
        asked = {"Pod": {"metadata": {"name": "x", "namespace": self.namespace, "uid": "x"},
                         "spec": {"priority": HIGH, "containers": [
                             {"name": "main", "resources": {"limits": {NVIDIA_GPUMEM: "12000"}}}]}},
                 "NodeNameToMetaVictims": {node: {"Pods": []}}}
        answer = post(extender, "preempt", asked)["NodeNameToMetaVictims"]
        assert answer == {node: {"Pods": [{"UID": uids[victim]}], "NumPDBViolations": 0}}
        took = self.schedule_urgent(extender, node, timeout)
        assert extender.metric("gpupool_extender_requests_total", outcome="ok", verb="preempt") >= 2
        assert self.left() == set(held) - {victim} | {"urgent"}  # only the victim was evicted
        assert self.urgent_cards() == [held[victim][0]]
        return took

    def node_held(self, extender: ExtenderProcess, held: dict[str, tuple[int, int, bool]]) -> str:
        """A node with two cards, and on it the low-priority pods of ``held`` (card, MiB, borrower?)."""
        node = f"preempt-{uuid.uuid4().hex[:6]}"
        cards = tuple(GpuCard(i, f"GPU-{node}-{i}", "Tesla-P100", CARD) for i in range(2))
        self.make_node(node, {"cpu": "64", "memory": "256Gi", "pods": "250", NVIDIA_GPUMEM: "1"},
                       annotations={NAMES.inventory: encode_inventory(Inventory(cards))})
        wait_for(lambda: extender.passes(probe(12000), [node]) or None, timeout=20,
                 what="the extender knows the node")
        for name, (card, mib, borrowed) in held.items():
            manifest = with_priority(placed_pod(name, node, card, mib), self.priority_classes[0])
            if borrowed:
                manifest["metadata"]["annotations"][BORROWED] = "true"
            self.core_v1.create_namespaced_pod(self.namespace, manifest)
        assert {self.core_v1.read_namespaced_pod(n, self.namespace).spec.priority for n in held} == {LOW}
        return node

    def schedule_urgent(self, extender: ExtenderProcess, node: str, timeout: float) -> float:
        """A high-priority pod asking 12000 MiB, pinned to ``node``, through kube-scheduler; the
        seconds until it was bound there."""
        scheduler_name = f"gpupool-preempt-{uuid.uuid4().hex[:6]}"
        scheduler = run_scheduler(self.binaries, self.control_plane, self.tmp_path, extender.url, scheduler_name)
        try:
            wanted = with_priority(placed_pod("urgent", node, 0, 12000), self.priority_classes[1])
            wanted["spec"].pop("nodeName")
            wanted["metadata"]["annotations"] = {}
            wanted["spec"]["schedulerName"] = scheduler_name
            wanted["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            self.core_v1.create_namespaced_pod(self.namespace, wanted)
            started = time.monotonic()
            assert self.core_v1.read_namespaced_pod("urgent", self.namespace).spec.priority == HIGH
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


@pytest.mark.parametrize(("patched", "lagging"), [
    pytest.param(False, False, id="stock-v1.20.2-survives-and-never-preempts"),
    pytest.param(True, False, id="fixed-scheduler-evicts-one-holder"),
    pytest.param(True, True, id="fixed-scheduler-evicts-one-holder-when-the-extender-lags"),
])
def test_a_gpu_pod_that_could_preempt_on_two_nodes(
    request: pytest.FixtureRequest, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
    make_node: MakeNode, priority_classes: tuple[str, str], tmp_path: Path, patched: bool, lagging: bool,
) -> None:
    """Two nodes, each card held by one low-priority pod. kube-scheduler's dry run finds both nodes
    fit with no victims; stock v1.20.2 ranks two such candidates by their first victim and crashes
    (kubernetes#101548) unless the shipped configuration's single candidate avoids the ranking. It
    then nominates a node and evicts nobody (it never asks the extender); a fixed kube-scheduler
    asks the extender, which names the one holder to evict. When kube-scheduler retries the pod
    before the extender has seen that eviction (always, with the lagging extender), the filter
    still refuses both nodes, and a second answer would evict the other holder too: the extender
    names nobody while the first holder's eviction is under way."""
    binaries: Binaries = request.getfixturevalue("preempting_binaries" if patched else "testenv_binaries")
    extender_process: ExtenderProcess = request.getfixturevalue("lagging_extender" if lagging else "extender_process")
    low, high = priority_classes
    nodes = [f"pair-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for node in nodes:
        card = GpuCard(0, f"GPU-{node}-0", "Tesla-P100", CARD)
        make_node(node, {"cpu": "64", "memory": "256Gi", "pods": "250", NVIDIA_GPUMEM: "1"},
                  annotations={NAMES.inventory: encode_inventory(Inventory((card,)))})
    # one node at a time: the filter passes one of several equally good nodes (--filter-one-best)
    wait_for(lambda: all(extender_process.passes(probe(12000), [node]) == [node] for node in nodes) or None,
             timeout=20, what="the extender knows the nodes")
    for node in nodes:
        core_v1.create_namespaced_pod(namespace, with_priority(placed_pod(f"held-{node}", node, 0, 12000), low))
    wait_for(lambda: not extender_process.passes(probe(12000), nodes) or None, timeout=20,
             what="the extender books the low-priority pods")
    scheduler_name = f"gpupool-pair-{uuid.uuid4().hex[:6]}"
    scheduler = run_scheduler(binaries, control_plane, tmp_path, extender_process.url, scheduler_name)
    try:
        wanted = with_priority(placed_pod("urgent", nodes[0], 0, 12000), high)
        wanted["spec"].pop("nodeName")
        wanted["metadata"]["annotations"] = {}
        wanted["spec"]["schedulerName"] = scheduler_name
        core_v1.create_namespaced_pod(namespace, wanted)
        urgent = lambda: core_v1.read_namespaced_pod("urgent", namespace)  # noqa: E731
        if patched:
            bound = wait_for(lambda: urgent().spec.node_name, timeout=BIND_TIMEOUT_S,
                             what="the pod bound after preemption")
        else:
            bound = None
            wait_for(lambda: urgent().status.nominated_node_name or not scheduler.alive() or None, timeout=60,
                     what="kube-scheduler nominating a node for the pod")
            assert scheduler.alive(), scheduler.log_tail(40)
    finally:
        scheduler.stop()
    held = {p.metadata.name for p in core_v1.list_namespaced_pod(namespace).items
            if p.metadata.deletion_timestamp is None and p.metadata.name != "urgent"}
    if patched:
        assert held == {f"held-{n}" for n in nodes if n != bound}
    else:
        assert held == {f"held-{n}" for n in nodes}


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
