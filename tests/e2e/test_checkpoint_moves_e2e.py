"""Checkpoints that move, end to end: a borrower reclaimed on node A resumes on node B.

Two nodes on the session's control plane, each with its own ``gpupool node-agent --lending`` and one
stand-in card, both agents given the SAME ``--checkpoint-dir`` (one host directory standing in for an
NFS share every node mounts at the same path):

* node A: a real kubelet with containerd and runc (the pods run ``examples/checkpoint_worker.sh``
  for real); its card is ``/dev/random``'s numbers, as in the lending loop;
* node B: a second kubelet on the fake CRI runtime (two real kubelets cannot run on one machine);
  its card has ``/dev/full``'s numbers, so neither agent's usage monitor takes the other node's
  containers for holders of its card. The fake runtime writes each container's environment to its
  log, and kubelet keeps every Allocate answer in its device-manager checkpoint.

The real kube-scheduler with the shipped configuration calls the real ``gpupool extender``;
kube-controller-manager runs the ReplicaSet controller.

1. The owner (12 GiB of A's 16 GiB card) idles; A lends the card. B is cordoned meanwhile, so the
   ReplicaSet's low-priority pod (8 GiB, more than A's 4 GiB free) can only borrow on A's loan.
   It runs the worker, which counts steps; A's grant mounts the task's directory of the shared root.
2. B is uncordoned and A cordoned (as a drain would), then the owner opens its card: A's agent
   signals the worker, which writes ``ckpt-<step>`` and exits, and evicts it (``GpuReclaimed``).
3. The ReplicaSet's replacement is placed by the scheduler and the extender on B's free card. B's
   Allocate (read back from B's kubelet) mounts the very host directory A's grant mounted and names
   A's checkpoint in ``GPUPOOL_RESUME_FROM``; the container's environment (the fake runtime's log)
   carries the same.

Why this fails for a node-local checkpoint root: B's agent finds the directory by the task key alone
(the ReplicaSet's UID, within the namespace). Had the path named the node, or had each node its own
root, B's directory would be another, empty one: its grant would mount a different host path (the
equality with A's mount fails) and carry no ``GPUPOOL_RESUME_FROM`` (the env checks fail). The second
case runs exactly that (each agent its own ``--checkpoint-dir``) and sees the replacement start over
in B's own, empty directory of the same task.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from bench.reclaim import CARD_MIB, OWNER, WORKER, one_card
from gpupool.api.lending import CHECKPOINT_MOUNT, RECLAIMED_REASON, RESUME_FROM_ENV, is_borrowed
from gpupool.nodeagent.deviceplugin.generated import gpupool_deviceplugin_v1beta1_pb2 as pb
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.kubelet import Kubelet
from gpupool.testenv.paths import Binaries
from tests.e2e import real_containers, test_preempt_e2e
from tests.e2e.e2e_support import (
    ExtenderProcess,
    NodeAgentProcess,
    StartKubelet,
    env_from_log,
    ignore_404,
    pod_gone,
    wait_for,
)
from tests.e2e.test_lending_loop_e2e import (
    BORROWER_UNITS,
    OWNER_UNITS,
    allocatable,
    borrower_running,
    check_borrower,
    gpu_pod,
    holders,
    lent,
    replica_set,
    running,
)
from tests.e2e.test_preempt_e2e import with_priority
from tests.e2e.test_scheduler_config_e2e import run_scheduler

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

containerd_kubelet = real_containers.containerd_kubelet  # node A (a fixture)
priority_classes = test_preempt_e2e.priority_classes  # the fixture: a low and a high PriorityClass

B_CARD = (1, 7)
"""Node B's stand-in card: ``/dev/full``'s numbers (A's is ``/dev/random``'s)."""
DEVICE_CHECKPOINT = "kubelet_internal_checkpoint"
"""kubelet's device-manager checkpoint in its device-plugin directory: every Allocate answer it holds."""


def b_card(directory: Path) -> str:
    """Node B's one stand-in card and the ``--fake-gpus`` file naming it (its own UUID)."""
    directory.mkdir(parents=True)
    os.mknod(directory / "nvidia0", 0o666 | stat.S_IFCHR, os.makedev(*B_CARD))
    return (f"model: Tesla-T4\ndevicePathPrefix: {directory}/nvidia\n"
            f"cards:\n  - {{uuid: GPU-node-b-0000, memoryMiB: {CARD_MIB}}}\n")


def lending(root: Path) -> tuple[str, ...]:
    """The agents' flags: lending on, checkpoints under ``root``."""
    return ("--lending", "--idle-after", "2s", "--checkpoint-deadline", "3", "--checkpoint-dir", str(root),
            "--lease-namespace", "")


def cordon(core_v1: client.CoreV1Api, node: str, on: bool) -> None:
    core_v1.patch_node(node, {"spec": {"unschedulable": on}})


def on_either(pod: dict[str, Any], nodes: tuple[str, str]) -> dict[str, Any]:
    """``pod`` allowed on both nodes (in place of its one-node selector)."""
    spec = pod["spec"]
    spec.pop("nodeSelector")
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}]}
    required = {"nodeSelectorTerms": [term]}
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    spec["containers"][0]["imagePullPolicy"] = "IfNotPresent"  # A has the image; B's fake runtime "pulls" it
    return pod


def card_published(core_v1: client.CoreV1Api, node: str) -> Callable[[], bool]:
    """Whether the node's allocatable shows its one card's memory devices."""
    return lambda: allocatable(core_v1, node) == CARD_MIB // 256


def allocate_answers(kubelet: Kubelet, pod_uid: str) -> list[Any]:
    """The Allocate answers kubelet holds for ``pod_uid`` (``ContainerAllocateResponse``s, one per
    resource), from its device-manager checkpoint: what it hands the runtime for the container."""
    path = kubelet.device_plugin_dir / DEVICE_CHECKPOINT
    if not path.exists():
        return []
    entries = json.loads(path.read_text())["Data"].get("PodDeviceEntries") or []
    answers = []
    for entry in entries:
        if entry.get("PodUID") == pod_uid and entry.get("AllocResp"):
            answer = pb.ContainerAllocateResponse()
            answer.ParseFromString(base64.b64decode(entry["AllocResp"]))
            answers.append(answer)
    return answers


def checkpoint_grant(kubelet: Kubelet, pod_uid: str) -> tuple[str, dict[str, str]] | None:
    """The host directory an Allocate answer mounts at the checkpoint mount, and that answer's env."""
    for answer in allocate_answers(kubelet, pod_uid):
        for mount in answer.mounts:
            if mount.container_path == CHECKPOINT_MOUNT:
                assert not mount.read_only, mount
                return str(mount.host_path), dict(answer.envs)
    return None


@pytest.mark.parametrize("shared_root", [True, False], ids=["one-shared-root", "node-local-roots"])
def test_a_borrower_reclaimed_on_one_node_resumes_on_another_only_from_a_shared_checkpoint_root(
    shared_root: bool, testenv_binaries: Binaries, control_plane: ControlPlane, core_v1: client.CoreV1Api,
    namespace: str, containerd_kubelet: Kubelet, start_kubelet: StartKubelet, tmp_path: Path,
    start_node_agent: Callable[..., NodeAgentProcess], extender_process: ExtenderProcess,
    priority_classes: tuple[str, str],
) -> None:
    began = time.monotonic()
    low, _ = priority_classes
    node_a, image = containerd_kubelet.node_name, containerd_kubelet.images.busybox.ref
    kubelet_b = start_kubelet(f"e2e-b-{uuid.uuid4().hex[:6]}")
    node_b = kubelet_b.node_name
    cordon(core_v1, node_b, True)  # until the first borrower runs on A's loan
    # one host path both agents are given (the "NFS share"), or the negative case: each node its own
    roots = (tmp_path / "shared-checkpoints",) * 2 if shared_root else (tmp_path / "ckpt-a", tmp_path / "ckpt-b")
    prefix, trigger = f"{tmp_path / 'dev-a'}/nvidia", tmp_path / "trigger"
    trigger.mkdir()
    agent_a = start_node_agent(containerd_kubelet, one_card(tmp_path / "dev-a"), lending(roots[0]))
    agent_b = start_node_agent(kubelet_b, b_card(tmp_path / "dev-b"), lending(roots[1]))
    scheduler_name = f"gpupool-moves-{uuid.uuid4().hex[:6]}"
    scheduler = run_scheduler(testenv_binaries, control_plane, tmp_path, extender_process.url, scheduler_name)
    try:
        control_plane.start_controllers(("replicaset",))
        for node, agent in ((node_a, agent_a), (node_b, agent_b)):
            wait_for(card_published(core_v1, node), timeout=60, what=f"the card's devices on {node}\n{agent.log()}")
        core_v1.create_namespaced_pod(namespace, gpu_pod("owner", node_a, image, scheduler_name, OWNER_UNITS,
                                                         OWNER, {}, prefix, trigger))
        wait_for(lambda: running(core_v1, namespace, "owner"), timeout=90,
                 what=f"the owner placed and Running on A\n{agent_a.log()}")
        wait_for(lambda: lent(core_v1, node_a), timeout=60, what=f"A's card lent\n{agent_a.log()}")

        apps = client.AppsV1Api(core_v1.api_client)
        template = on_either(with_priority(gpu_pod("borrower", node_a, image, scheduler_name, BORROWER_UNITS,
                                                   "STEP_SECONDS=0.2\n" + WORKER.read_text(), {}, prefix), low),
                             (node_a, node_b))
        apps.create_namespaced_replica_set(namespace, replica_set(template))
        first = wait_for(lambda: borrower_running(core_v1, namespace), timeout=60,
                         what=f"the borrower placed on A's loan and Running\n{agent_a.log()}")
        assert first.spec.node_name == node_a
        check_borrower(first, namespace)
        name, uid = str(first.metadata.name), str(first.metadata.uid)
        on_a = wait_for(lambda: checkpoint_grant(containerd_kubelet, uid), timeout=10,
                        what="A's Allocate answer for the borrower in kubelet's checkpoint")
        task_dir = Path(on_a[0])
        assert task_dir.parent.parent == roots[0] and task_dir.parent.name == namespace, task_dir
        assert RESUME_FROM_ENV not in on_a[1], on_a[1]  # the first pod of its task: nothing to resume
        wait_for(lambda: "started at step 0" in (core_v1.read_namespaced_pod_log(name, namespace) or ""),
                 timeout=30, what="the worker counting on A")

        cordon(core_v1, node_b, False)
        cordon(core_v1, node_a, True)  # the replacement cannot go back to A's card, lent again soon
        time.sleep(1.0)  # a few steps counted
        (trigger / "go-1").touch()  # the owner opens its card again: the borrower is reclaimed
        wait_for(lambda: pod_gone(core_v1, namespace, name), timeout=30, interval=0.1,
                 what=f"the borrower reclaimed and evicted on A\n{agent_a.log()}")
        reasons = [e.reason for e in core_v1.list_namespaced_event(namespace).items if e.involved_object.name == name]
        assert RECLAIMED_REASON in reasons, reasons
        written = sorted(task_dir.glob("ckpt-*"), key=lambda p: int(p.name.partition("-")[2]))
        assert written, f"the worker wrote no checkpoint in {task_dir}\n{agent_a.log()}"
        newest = written[-1]
        step = int(newest.read_text())
        assert step > 0 and newest.name == f"ckpt-{step}", (newest, step)

        second = wait_for(lambda: borrower_running(core_v1, namespace, not_named=name), timeout=60,
                          what=f"the replacement placed and Running\n{agent_b.log()}")
        assert second.spec.node_name == node_b, second.spec.node_name
        assert not is_borrowed(second.metadata.annotations or {})  # B's card is free: no loan needed
        on_b = wait_for(lambda: checkpoint_grant(kubelet_b, str(second.metadata.uid)), timeout=10,
                        what=f"B's Allocate answer for the replacement in kubelet's checkpoint\n{agent_b.log()}")
        env = wait_for(lambda: env_from_log(core_v1.read_namespaced_pod_log(second.metadata.name, namespace) or "")
                       or None, timeout=10, what="the replacement's environment in its log")
        resume = f"{CHECKPOINT_MOUNT}/{newest.name}"
        if shared_root:  # B's agent mounts the very directory A's worker wrote in, and names A's checkpoint
            assert Path(on_b[0]) == task_dir, (on_b[0], task_dir)
            assert on_b[1].get(RESUME_FROM_ENV) == resume, on_b[1]
            assert env.get(RESUME_FROM_ENV) == resume, env
        else:  # the same task's directory, but under B's own root: empty, the replacement starts over
            assert Path(on_b[0]) == roots[1] / task_dir.relative_to(roots[0]), (on_b[0], task_dir)
            assert not list(Path(on_b[0]).iterdir())
            assert RESUME_FROM_ENV not in on_b[1] and RESUME_FROM_ENV not in env, (on_b[1], env)
        assert agent_a.running() and agent_b.running(), (agent_a.log(), agent_b.log())
        print(f"\n  checkpoint at step {step} on A; B {'resumed from it' if shared_root else 'started over'}; "
              f"test body {time.monotonic() - began:.1f} s")
    finally:
        for node in (node_a, node_b):
            try:
                cordon(core_v1, node, False)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
        scheduler.stop()
        control_plane.stop_controllers()
        # the next case's agent on A watches the same device numbers: no container of this one may hold them
        for pod in core_v1.list_namespaced_pod(namespace).items:
            ignore_404(lambda p=pod: core_v1.delete_namespaced_pod(p.metadata.name, namespace, grace_period_seconds=0))
        wait_for(lambda: not holders(agent_a, f"{prefix}0") or None, timeout=30, what="A's containers gone")
