"""kube-scheduler's Service follows the leader by a label while every synced replica is Ready
(gpupool/extender/leader_label.py), so the Deployment can roll: on the real apiserver, two
``gpupool extender`` processes, each with ``--leader-pod`` naming a Pod object of its own. The
leader's pod carries ``gpupool.io/extender-leader=true``, the follower's does not; the leader
stopped cleanly (SIGTERM, as a rolling update stops it) takes its label off and the follower,
already synced, is labelled about 4.5 s later: the time kube-scheduler has no extender in an
upgrade, where Recreate left it without one for a new replica's start, sync and Lease take-over.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from gpupool.extender.leader_label import LEADER_LABEL
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import ExtenderProcess, log_tail

pytestmark = pytest.mark.e2e

HANDOVER_S = 8.0
"""The follower is labelled this soon after the leader's label went: the commit timeout the stopping
leader waits out before it releases the Lease (3.2 s: binds in flight finish), the election's retry
period (1 s), the new term's quorum list and one label sync (0.5 s); measured 4.4 s, with room for a
loaded machine."""


def labelled(core_v1: client.CoreV1Api, namespace: str, name: str) -> bool:
    labels = core_v1.read_namespaced_pod(name, namespace).metadata.labels or {}
    return labels.get(LEADER_LABEL) == "true"


def replicas(control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str, tmp_path: Path, lease: str,
             identity: str, stale_label: str | None = None) -> tuple[ExtenderProcess, ExtenderProcess]:
    """Two extender replicas ``a`` and ``b`` (not started) on one Lease, each with its own pod
    ``replica-a``/``replica-b`` as the Deployment's would be; ``stale_label`` names the one whose pod
    already carries the leader label (left from before)."""
    for who in ("a", "b"):
        core_v1.create_namespaced_pod(namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"replica-{who}",
                                         labels={LEADER_LABEL: "true"} if who == stale_label else {}),
            spec=client.V1PodSpec(containers=[client.V1Container(name="extender", image="gpupool:test")])))
    a, b = (ExtenderProcess(control_plane.kubeconfig, tmp_path / f"extender-{who}.log",
                            extra_args=("--identity", f"{identity}-{who}", "--lease-name", lease,
                                        "--leader-pod", f"{namespace}/replica-{who}"))
            for who in ("a", "b"))
    return a, b


def test_the_label_moves_to_the_follower_when_the_leader_stops_cleanly(
        control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str, tmp_path: Path) -> None:
    lease = f"ll-{uuid.uuid4().hex[:6]}"
    a, b = replicas(control_plane, core_v1, namespace, tmp_path, lease, "ll", stale_label="b")
    try:
        a.start()
        b.start(follower=True)
        deadline = time.monotonic() + 10
        # the leader labels itself; the follower takes off a label it found (a stale one from before)
        while not (labelled(core_v1, namespace, "replica-a") and not labelled(core_v1, namespace, "replica-b")):
            assert time.monotonic() < deadline, f"labels never settled:\n{log_tail(a.log_path)}\n{log_tail(b.log_path)}"
            time.sleep(0.1)

        assert a.proc is not None
        a.proc.send_signal(signal.SIGTERM)  # a rolling update's stop
        deadline = time.monotonic() + 15
        while labelled(core_v1, namespace, "replica-a"):
            assert time.monotonic() < deadline, f"the stopping leader kept its label:\n{log_tail(a.log_path)}"
            time.sleep(0.05)
        unlabelled_at = time.monotonic()
        while not labelled(core_v1, namespace, "replica-b"):
            assert time.monotonic() - unlabelled_at < HANDOVER_S, \
                f"the follower was not labelled {HANDOVER_S} s after the leader stopped:\n{log_tail(b.log_path)}"
            time.sleep(0.05)
        gap = time.monotonic() - unlabelled_at
        print(f"\nleader label: replica-a off -> replica-b on in {gap:.2f} s")
        assert a.proc.wait(15) == 0
    finally:
        a.kill()
        b.kill()


CRASH_GAP_S = 20.0
"""The follower is labelled this soon after the leader is SIGKILLed: the Lease expires (lease
duration 10 s after the last renewal), the election's retry (1 s), the quorum list, one label sync;
generous for a loaded machine."""


def test_after_a_sigkill_the_new_leader_labels_itself_and_unlabels_the_dead_one(
        control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str, tmp_path: Path) -> None:
    lease = f"lk-{uuid.uuid4().hex[:6]}"
    a, b = replicas(control_plane, core_v1, namespace, tmp_path, lease, "lk")
    try:
        a.start()
        b.start(follower=True)
        deadline = time.monotonic() + 10
        while not labelled(core_v1, namespace, "replica-a"):
            assert time.monotonic() < deadline, f"the leader never labelled itself:\n{log_tail(a.log_path)}"
            time.sleep(0.1)
        assert a.proc is not None
        a.proc.send_signal(signal.SIGKILL)  # a crash, an OOM kill: no label removal, no Lease release
        killed_at = time.monotonic()
        a.proc.wait(5)
        assert labelled(core_v1, namespace, "replica-a")  # the dead leader could not take it off
        while not labelled(core_v1, namespace, "replica-b"):
            assert time.monotonic() - killed_at < CRASH_GAP_S, \
                f"the follower was not labelled {CRASH_GAP_S} s after the kill:\n{log_tail(b.log_path)}"
            time.sleep(0.05)
        gap = time.monotonic() - killed_at
        deadline = time.monotonic() + 5
        while labelled(core_v1, namespace, "replica-a"):  # the new leader takes the dead one's label off
            assert time.monotonic() < deadline, f"the dead leader kept its label:\n{log_tail(b.log_path)}"
            time.sleep(0.05)
        print(f"\nleader SIGKILLed -> replica-b labelled in {gap:.2f} s; replica-a unlabelled "
              f"{time.monotonic() - killed_at:.2f} s after the kill")
    finally:
        a.kill()
        b.kill()
