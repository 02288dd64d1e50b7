"""Two extender replicas in process against the real kube-apiserver, sharing one Lease.

The leader binds, then stops (no more renewals, as a crashed replica); the second replica, whose pod
watch lags so that its ledger lacks the first one's last booking, takes the Lease over, catches up
with a quorum list and binds the next pod next to that booking rather than onto it.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.annotations import Inventory, decode_assignment, encode_inventory
from gpupool.api.names import NVIDIA_GPUMEM, ResourceNames
from gpupool.cli.extender_cmd import ExtenderOptions, Replica, start_replica
from gpupool.core.model import GpuCard
from gpupool.extender.handover import CATCHING_UP
from gpupool.extender.lease import LeaseSettings
from gpupool.extender.service import BindResult
from tests.e2e.e2e_support import NO_SCHEDULER, MakeNode

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
#: Short timings so the hand-over takes seconds: commit timeout 0.8 s.
FAST_LEASE = LeaseSettings(lease_duration=3.0, renew_deadline=2.0, retry_period=0.5)


class LaggingPodWatch:
    """``CoreV1Api`` whose pod *watch* calls wait for :attr:`released`; lists go through.

    A replica built on it syncs from its first list and then sees no pod event at all: the most
    stale ledger a watch can leave behind."""

    def __init__(self, core_v1: client.CoreV1Api) -> None:
        self._core = core_v1
        self.released = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        if kwargs.get("watch"):
            self.released.wait()
        return self._core.list_pod_for_all_namespaces(**kwargs)


def gpu_pod(name: str, mib: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": NO_SCHEDULER, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {NVIDIA_GPUMEM: str(mib)}}}]}}


def bind_until_ok(replica: Replica, core_v1: client.CoreV1Api, namespace: str, name: str, node: str,
                  timeout: float = 30.0) -> tuple[BindResult, list[str]]:
    """Retry the bind as kube-scheduler would; returns the result and the distinct errors seen."""
    uid = core_v1.read_namespaced_pod(name, namespace).metadata.uid
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        result = replica.service.bind(namespace, name, uid, node)
        if result.ok or time.monotonic() > deadline:
            return result, errors
        if result.error not in errors:
            errors.append(result.error)
        time.sleep(0.05)


def free_mib(replica: Replica, node: str) -> list[int]:
    with replica.cache.lock:
        return [u.memory_free for u in replica.cache.state.card_usage(node)]


def test_the_second_replica_takes_over_and_does_not_double_book(
    core_v1: client.CoreV1Api, kube_api_client: client.ApiClient, namespace: str, make_node: MakeNode
) -> None:
    node = f"ha-{uuid.uuid4().hex[:6]}"
    cards = tuple(GpuCard(i, f"GPU-{node}-{i}", "Tesla-P100", 16276) for i in range(2))
    make_node(node, {"cpu": "64", "memory": "256Gi", "pods": "250", NVIDIA_GPUMEM: "1"},
              annotations={NAMES.inventory: encode_inventory(Inventory(cards))})
    for name in ("p1", "p2"):
        core_v1.create_namespaced_pod(namespace, gpu_pod(name, 10000))
    core_v1.create_namespaced_pod(namespace, gpu_pod("waits", 16000))  # no card has room once p1 is bound
    coordination = client.CoordinationV1Api(kube_api_client)

    def options(identity: str) -> ExtenderOptions:
        return ExtenderOptions(policy="binpack", lease_namespace=namespace, identity=identity)

    lagging = LaggingPodWatch(core_v1)
    a = start_replica(options("a"), core_v1, coordination, FAST_LEASE)
    b: Replica | None = None
    try:
        assert a.elector is not None
        deadline = time.monotonic() + 20
        while not a.elector.is_leader():  # a first, so that b finds the Lease held
            assert time.monotonic() < deadline, "replica a never became leader"
            time.sleep(0.05)
        b = start_replica(options("b"), lagging, coordination, FAST_LEASE)
        while not b.cache.synced:  # b's one list is taken before a binds
            assert time.monotonic() < deadline + 20, "replica b never synced"
            time.sleep(0.05)
        first, _ = bind_until_ok(a, core_v1, namespace, "p1", node)
        assert first.ok, first.error
        assert b.elector is not None and not b.elector.is_leader()
        assert free_mib(a, node) == [6276, 16276]
        assert free_mib(b, node) == [16276, 16276]  # b's ledger lacks a's booking

        a.shutdown()  # a stops renewing: after 3 s without a change b may take the Lease
        second, errors = bind_until_ok(b, core_v1, namespace, "p2", node)
        assert second.ok, (second.error, errors)
        assert any("not the leader" in e for e in errors)  # refused while a held the Lease
        assert set(errors) <= {e for e in errors if "not the leader" in e} | {CATCHING_UP}
        placed = {}
        for p in core_v1.list_namespaced_pod(namespace).items:
            if p.metadata.name == "waits":
                continue
            assert p.spec.node_name == node
            placed[p.metadata.name] = decode_assignment(p.metadata.annotations[NAMES.assignment])
        card_of = {name: a.containers[0].cards[0].index for name, a in placed.items()}
        assert card_of == {"p1": 0, "p2": 1}  # not both on card 0 (20,000 MiB on a 16,276 MiB card)
        assert b.pod_watch.catch_ups == 1  # the quorum list brought a's booking, not the watch
        lease = coordination.read_namespaced_lease("gpupool-extender", namespace)
        assert lease.spec.holder_identity == "b" and lease.spec.lease_transitions == 1
        # b adopted the pod still waiting, whose refusal (if any) died with a: a change wakes it
        assert b.wakeup is not None
        deadline = time.monotonic() + 10
        while b.wakeup.stats["adopted"] < 1:
            assert time.monotonic() < deadline, "the new leader adopted no waiting pod"
            time.sleep(0.05)
        assert b.wakeup.tracked() >= 1
    finally:
        lagging.released.set()
        a.shutdown()
        if b is not None:
            b.shutdown()
