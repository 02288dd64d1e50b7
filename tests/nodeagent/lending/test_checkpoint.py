"""The checkpoint protocol: per-task directories, the grant's env and mount, and a real resume."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpupool.api import lending as contract
from gpupool.nodeagent.isolation.backends import NoEnforcement
from gpupool.nodeagent.lending.checkpoint import (
    CheckpointEnforcement,
    CheckpointStore,
    find_cuda_checkpoint,
    task_dir_name,
)
from gpupool.nodeagent.lending.pods import LendingPods
from gpupool.nodeagent.lending.reclaim import Reclaimer, ReclaimOrder, ReclaimResult
from gpupool.nodeagent.types import GrantExtras, Mount, PodView
from tests.nodeagent.lending.support import LEND, NAMES, pod_json
from tests.nodeagent.lending.test_reclaim import TARGET, WORKER, Api, Children, wait_started


def view(name: str) -> PodView:
    return PodView("ns", name, f"uid-{name}", "n1", 0.0, False, ())


def test_the_task_key_is_the_annotation_then_the_controller_then_the_pod(tmp_path: Path) -> None:
    pods = LendingPods(NAMES, LEND)
    pods.on_list([pod_json("a", annotations={LEND.checkpoint_key: "train-7"}), pod_json("b", owner_uid="job-uid"),
                  pod_json("c")])
    assert [pods.get(("ns", n)).checkpoint_key for n in "abc"] == ["train-7", "job-uid", "ns/c"]  # type: ignore[union-attr]


def test_directory_names_are_safe_and_distinct() -> None:
    assert task_dir_name("ns/c").startswith("ns_c-")
    assert task_dir_name("ns/c") != task_dir_name("ns_c")
    assert "/" not in task_dir_name("../../etc") and not task_dir_name("../../etc").startswith(".")


def test_the_grant_gets_the_protocol_and_resumes_from_the_newest_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path), deadline_s=7)
    pods = LendingPods(NAMES, LEND)
    pods.on_list([pod_json("w", owner_uid="job-1")])
    wrapped = CheckpointEnforcement(NoEnforcement(), store, pods.get)
    first = wrapped.grant_extras(view("w"), "c")
    host = store.directory("job-1")
    assert first == GrantExtras(envs={contract.CHECKPOINT_DIR_ENV: contract.CHECKPOINT_MOUNT,
                                      contract.CHECKPOINT_SIGNAL_ENV: "SIGUSR1",
                                      contract.CHECKPOINT_DEADLINE_ENV: "7"},
                                mounts=(Mount(host, contract.CHECKPOINT_MOUNT, read_only=False),))
    Path(host, "ckpt-3").write_text("3\n")
    os.utime(Path(host, "ckpt-3"), (1, 1))
    Path(host, "ckpt-9").write_text("9\n")
    Path(host, ".ckpt.tmp").write_text("10\n")  # work in progress is never resumed from
    assert wrapped.grant_extras(view("w"), "c").envs[contract.RESUME_FROM_ENV] == f"{contract.CHECKPOINT_MOUNT}/ckpt-9"


@pytest.mark.slow
def test_a_reclaimed_worker_resumes_from_its_checkpoint_when_restarted(tmp_path: Path) -> None:
    """Real processes (no container): the example worker runs, is reclaimed (signal), writes its
    checkpoint, and its restart with the env the grant would give resumes from that step."""
    store = CheckpointStore(str(tmp_path))
    host = store.directory("job-1")
    children = Children()
    proc = children.start(Path(host))
    wait_started(proc)
    time.sleep(0.5)

    async def reclaim() -> ReclaimResult:
        return await Reclaimer(children, Api(), poll_s=0.02).reclaim(ReclaimOrder(("ns", "w"), TARGET, "t", 5))

    result = asyncio.run(reclaim())
    assert result.killed == 0
    assert proc.wait(1) == 0
    newest = store.newest(host)
    assert newest is not None
    step = int(Path(host, newest).read_text())
    assert step >= 2
    again = _run_briefly(host, newest)
    assert again.splitlines()[:2] == [f"resumed from {host}/{newest} at step {step}", f"started at step {step}"]


def _run_briefly(host: str, newest: str) -> str:
    proc = subprocess.Popen(["sh", WORKER], env={**os.environ, contract.CHECKPOINT_DIR_ENV: host,
                                                  contract.RESUME_FROM_ENV: f"{host}/{newest}", "STEP_SECONDS": "0.1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(0.4)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=2)
    return out.decode()


def test_cuda_checkpoint_is_detected_on_the_path() -> None:
    assert find_cuda_checkpoint(lambda name: f"/usr/bin/{name}") == "/usr/bin/cuda-checkpoint"
    assert find_cuda_checkpoint(lambda name: None) is None
