"""What the node agent asks the apiserver, counted by the apiserver itself.

``gpupool node-agent`` runs against a real kubelet (v1.37.2) with the control plane's *audited*
kubeconfig, so every request it makes lands in the apiserver's audit log
(:mod:`gpupool.testenv.audit`); kube-scheduler and the ``gpupool extender`` place GPU pods on its
node. Requests are attributed to the phase in which the server received them and counted once the
agent has stopped (the audit log records a watch only when it ends):

* start-up: the inventory patch, one list and one watch of the node's pods;
* pods admitted after the cache synced: no read of any pod (no get, list or watch), only the
  ``allocated-v1`` patches;
* idle: nothing but the heartbeat Lease (a read and a write per renewal; the start-up watch stays
  open);
* a second agent start and an apiserver restart (the restarted apiserver's watch cache has
  forgotten the agent's resourceVersion: 410 Gone): lists and watches again, and the next pod
  again costs no read.

The counts are printed as one JSON line (docs/node-agent.md quotes them).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

from gpupool.api.agent_lease import DEFAULT_LEASE_NAMESPACE
from gpupool.api.annotations import decode_allocated
from gpupool.api.names import ResourceNames
from gpupool.nodeagent.kube_pod_source import USER_AGENT
from gpupool.testenv.audit import AuditedRequest, read_audit_log
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import (
    ContainerLimits,
    ExtenderProcess,
    NodeAgentProcess,
    StartKubelet,
    gpu_pod_manifest,
    wait_for,
)

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
GPUS = """\
model: Tesla-T4
cards:
  - {uuid: GPU-count-0000, memoryMiB: 16384}
  - {uuid: GPU-count-0001, memoryMiB: 16384}
"""
#: How long the agent is watched with nothing changing on its node.
IDLE_S = 10.0
#: kubelet's gpu-core devices for the two cards (100 per card) once the agent serves them.
CORE_DEVICES = "200"
#: Time for the last requests of a phase to be answered before the next phase starts.
SETTLE_S = 1.0
#: Pods admitted while counting: a whole card, a slice, and two GPU containers in one pod.
PODS: dict[str, list[ContainerLimits]] = {
    "whole": [("main", {NAMES.gpu: "1"})],
    "slice": [("main", {NAMES.gpu_mem: "16", NAMES.gpu_core: "30"})],
    "pair": [("a", {NAMES.gpu_mem: "8", NAMES.gpu_core: "10"}), ("b", {NAMES.gpu_mem: "8", NAMES.gpu_core: "10"})],
}


def agent_requests(plane: ControlPlane, node: str, start: float, end: float) -> list[AuditedRequest]:
    """The requests the agent of ``node`` (its user agent names it) made in ``[start, end)``."""
    return [r for r in read_audit_log(plane.audit_log)
            if r.user_agent.startswith(f"{USER_AGENT}/{node}") and start <= r.received < end]


#: The agent's heartbeat renewal interval (its default): the only requests it makes while idle.
RENEW_S = 10.0


def heartbeat(requests: list[AuditedRequest]) -> list[AuditedRequest]:
    return [r for r in requests if r.resource == "leases"]


def without_heartbeat(requests: list[AuditedRequest]) -> list[AuditedRequest]:
    return [r for r in requests if r.resource != "leases"]


def counts(requests: list[AuditedRequest]) -> dict[str, int]:
    return dict(sorted(Counter(r.what for r in requests).items()))


def allocated_to_all(core_v1: client.CoreV1Api, namespace: str, name: str, containers: list[ContainerLimits]) -> bool:
    """Running, and ``allocated-v1`` names every GPU container (the agent's last write for it)."""
    pod = core_v1.read_namespaced_pod(name, namespace)
    assert pod.status.phase != "Failed", (name, pod.status.reason, pod.status.message)
    text = (pod.metadata.annotations or {}).get(NAMES.allocated)
    served = {c.name for c in decode_allocated(text).containers} if text else set()
    return pod.status.phase == "Running" and served == {c for c, limits in containers if limits}


def ensure_namespace(core_v1: client.CoreV1Api, name: str) -> bool:
    """Create namespace ``name`` unless it exists; whether this call created it."""
    try:
        core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        return False
    return True


def test_node_agent_reads_no_pod_per_allocate_and_nothing_while_idle(
    control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet,
    gpupool_extender: ExtenderProcess, tmp_path: Path,
) -> None:
    node = f"e2e-count-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(node)
    # The heartbeat in the namespace the extender watches (the cluster's agentLeaseNamespace): an agent
    # beating elsewhere runs with other cluster settings, and the extender places no pod on its node.
    created_lease_namespace = ensure_namespace(core_v1, DEFAULT_LEASE_NAMESPACE)
    agent = NodeAgentProcess(kubelet, control_plane.audited_kubeconfig, GPUS, tmp_path)

    def admit(pods: dict[str, list[ContainerLimits]]) -> None:
        for name, containers in pods.items():
            core_v1.create_namespaced_pod(namespace, gpu_pod_manifest(name, containers, node=node))
        for name, containers in pods.items():
            wait_for(lambda n=name, c=containers: allocated_to_all(core_v1, namespace, n, c), timeout=90,
                     what=f"{name} Running with allocated-v1\n{agent.log()}")
        time.sleep(SETTLE_S)

    def synced(since: float) -> None:
        """Until the agent's pod list (logged when answered) is in; the watch follows at once."""
        wait_for(lambda: [r for r in agent_requests(control_plane, node, since, time.time() + 1)
                          if r.what == "list pods"], timeout=60, what=f"the agent's pod list\n{agent.log()}")
        time.sleep(SETTLE_S)

    def devices(healthy: bool) -> None:
        """Until kubelet reports the agent's compute devices all healthy, or none healthy."""
        def reported() -> bool:
            assert agent.running() or not healthy, agent.log()
            allocatable = core_v1.read_node(node).status.allocatable or {}
            return (allocatable.get(NAMES.gpu_core) == CORE_DEVICES) == healthy
        wait_for(reported, timeout=60, what=f"kubelet reporting {node}'s devices {healthy=}:\n{agent.log()}")

    try:
        began = time.time()
        agent.start()
        devices(healthy=True)
        synced(began)
        admitting = time.time()
        admit(PODS)
        idle_from = time.time()
        time.sleep(IDLE_S)
        idle_to = time.time()
        agent.stop()  # its watch ends and is logged
        devices(healthy=False)

        # Again from a fresh start, then through an apiserver restart.
        restarted = time.time()
        agent.start()
        devices(healthy=True)
        synced(restarted)
        control_plane.restart_apiserver()
        admit({"later": PODS["slice"]})
        agent.stop()
        ended = time.time() + 1
    finally:
        agent.stop()
        if created_lease_namespace:
            core_v1.delete_namespace(DEFAULT_LEASE_NAMESPACE)

    phases = {"startup": (began, admitting), "admitting": (admitting, idle_from), "idle": (idle_from, idle_to),
              "restarts": (restarted, ended)}
    everything = {phase: agent_requests(control_plane, node, *window) for phase, window in phases.items()}
    beats = {phase: heartbeat(requests) for phase, requests in everything.items()}
    got = {phase: without_heartbeat(requests) for phase, requests in everything.items()}
    measured = {phase: counts(requests) for phase, requests in got.items()}
    print(f"\nnode agent requests (idle {IDLE_S:.0f} s; restarts: agent, then apiserver, then one pod): "
          + json.dumps(measured) + "; heartbeat: " + json.dumps({p: counts(r) for p, r in beats.items()}))

    # two node patches: at start, the settings the agent runs with (agent-settings-v1) and its start-up
    # checks in one; the inventory with its enforcement notice (once kubelet accepted the device plugins)
    assert measured["startup"] == {"list pods": 1, "patch nodes": 2, "watch pods": 1}, got["startup"]
    query = {r.verb: parse_qs(urlsplit(r.uri).query) for r in got["startup"] if r.resource == "pods"}
    assert all(q["fieldSelector"] == [f"spec.nodeName={node}"] for q in query.values()), query
    assert query["list"]["resourceVersion"] == ["0"], query  # from the watch cache, not etcd
    admitted = got["admitting"]
    assert {r.what for r in admitted} == {"patch pods"}, admitted  # no get, list or watch per Allocate
    assert {r.name for r in admitted} == set(PODS)
    allocate_calls = sum(len(limits) for containers in PODS.values() for _, limits in containers)
    assert len(PODS) <= len(admitted) <= allocate_calls  # allocated-v1 writes: at most one per Allocate
    assert got["idle"] == []
    renewals = IDLE_S / RENEW_S + 1
    assert len(beats["idle"]) <= 2 * renewals, beats["idle"]  # a read and a write per renewal, no retry storm
    assert {r.what for r in beats["idle"]} <= {"get leases", "update leases", "create leases"}, beats["idle"]
    assert not without_heartbeat([r for r in read_audit_log(control_plane.audit_log)
                                  if r.user_agent.startswith(f"{USER_AGENT}/{node}")
                                  and idle_to <= r.received < restarted])
    recovered = got["restarts"]
    assert [r for r in recovered if r.verb == "get"] == [], recovered
    assert measured["restarts"]["list pods"] == 2, recovered  # start, 410
    assert {r.name for r in recovered if r.what == "patch pods"} == {"later"}
    assert "reading it from the API" not in agent.log()
