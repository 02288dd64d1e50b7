"""The checkpoint protocol: per-task directories, the grant's env and mount, and a real resume.

Also checkpoints that move (issue 26): two agents over one shared root, a replacement on the other
node resuming; tenants kept apart by namespace; partial and corrupt checkpoints passed over."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpupool.api import lending as contract
from gpupool.nodeagent.isolation.backends import NoEnforcement
from gpupool.nodeagent.lending.checkpoint import (
    CheckpointEnforcement,
    CheckpointStore,
    find_cuda_checkpoint,
    namespace_dir_name,
    task_dir_name,
)
from gpupool.nodeagent.lending.pods import LendingPods
from gpupool.nodeagent.lending.reclaim import Reclaimer, ReclaimOrder, ReclaimResult
from gpupool.nodeagent.types import GrantExtras, Mount, PodView
from tests.nodeagent.lending.support import LEND, decoded, pod_json
from tests.nodeagent.lending.test_reclaim import TARGET, WORKER, Api, Children, wait_started


def view(name: str, namespace: str = "ns", node: str = "n1") -> PodView:
    return PodView(namespace, name, f"uid-{name}", node, 0.0, False, ())


def test_the_task_key_is_the_annotation_then_the_controller_then_the_pod(tmp_path: Path) -> None:
    pods = LendingPods(LEND)
    pods.on_list(decoded(pod_json("a", annotations={LEND.checkpoint_key: "train-7"}),
                         pod_json("b", owner_uid="job-uid"), pod_json("c")))
    assert [pods.get(("ns", n)).checkpoint_key for n in "abc"] == ["train-7", "job-uid", "ns/c"]  # type: ignore[union-attr]


def test_directory_names_are_safe_and_distinct() -> None:
    assert task_dir_name("ns/c").startswith("ns_c-")
    assert task_dir_name("ns/c") != task_dir_name("ns_c")
    assert "/" not in task_dir_name("../../etc") and not task_dir_name("../../etc").startswith(".")


def test_the_grant_gets_the_protocol_and_resumes_from_the_newest_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path), deadline_s=7)
    pods = LendingPods(LEND)
    pods.on_list(decoded(pod_json("w", owner_uid="job-1")))
    wrapped = CheckpointEnforcement(NoEnforcement(), store, pods.get)
    first = wrapped.grant_extras(view("w"), "c")
    host = store.directory("ns", "job-1")
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
    host = store.directory("ns", "job-1")
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


def agent_on(node: str, root: Path, *pods: dict[str, Any]) -> CheckpointEnforcement:
    """One node agent's checkpoint side: its own pod feed, the shared ``root``."""
    feed = LendingPods(LEND)
    feed.on_list(decoded(*pods))
    return CheckpointEnforcement(NoEnforcement(), CheckpointStore(str(root)), feed.get)


def host_dir(extras: GrantExtras) -> Path:
    [mount] = extras.mounts
    return Path(mount.host_path)


@pytest.mark.slow
def test_a_borrower_reclaimed_on_node_a_resumes_on_node_b_from_the_shared_root(tmp_path: Path) -> None:
    """Two agents over one root (the shared mount): the ReplicaSet's pod is reclaimed on n1 with real
    processes; its replacement, granted by n2's agent, is told to resume and does."""
    shared = tmp_path / "nfs"
    node_a = agent_on("n1", shared, pod_json("w-1", owner_uid="rs-1"))
    node_b = agent_on("n2", shared, pod_json("w-2", owner_uid="rs-1"))
    first = node_a.grant_extras(view("w-1"), "c")
    assert contract.RESUME_FROM_ENV not in first.envs
    children = Children()
    proc = children.start(host_dir(first))
    wait_started(proc)
    time.sleep(0.4)

    async def reclaim() -> ReclaimResult:
        return await Reclaimer(children, Api(), poll_s=0.02).reclaim(ReclaimOrder(("ns", "w-1"), TARGET, "t", 5))

    assert asyncio.run(reclaim()).killed == 0 and proc.wait(1) == 0
    second = node_b.grant_extras(view("w-2", node="n2"), "c")
    assert host_dir(second) == host_dir(first)
    resume = second.envs[contract.RESUME_FROM_ENV]
    step = int((host_dir(second) / Path(resume).name).read_text())
    out = _run_briefly(str(host_dir(second)), Path(resume).name)
    assert out.splitlines()[0] == f"resumed from {host_dir(second)}/{Path(resume).name} at step {step}"


def test_a_key_is_looked_up_only_in_the_pods_own_namespace(tmp_path: Path) -> None:
    """Tenant b names tenant a's key and a's controller UID: it gets a directory of its own, empty."""
    root = tmp_path / "ckpt"
    agent = agent_on("n1", root, pod_json("a", namespace="team-a", annotations={LEND.checkpoint_key: "train"}),
                     pod_json("a2", namespace="team-a", owner_uid="rs-a"),
                     pod_json("b", namespace="team-b", annotations={LEND.checkpoint_key: "train"}),
                     pod_json("b2", namespace="team-b", annotations={LEND.checkpoint_key: "rs-a"}))
    a = host_dir(agent.grant_extras(view("a", "team-a"), "c"))
    a2 = host_dir(agent.grant_extras(view("a2", "team-a"), "c"))
    (a / "ckpt-5").write_text("5\n")
    (a2 / "ckpt-6").write_text("6\n")
    for name in ("b", "b2"):
        theirs = agent.grant_extras(view(name, "team-b"), "c")
        assert contract.RESUME_FROM_ENV not in theirs.envs
        assert host_dir(theirs).parent == root / "team-b" and host_dir(theirs) not in (a, a2)
    assert host_dir(agent.grant_extras(view("a", "team-a"), "c")) == a  # the tenant's own key still finds its own
    assert {p.name for p in root.iterdir()} == {"team-a", "team-b"}
    assert stat.S_IMODE((root / "team-a").stat().st_mode) == 0o700 and stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE(a.stat().st_mode) == 0o777  # any user the task's containers run as writes there
    assert namespace_dir_name("../x") != "../x" and "/" not in namespace_dir_name("../x")


def test_an_existing_wider_namespace_directory_is_narrowed(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    (tmp_path / "ns").mkdir(mode=0o755)
    store.directory("ns", "k")
    assert stat.S_IMODE((tmp_path / "ns").stat().st_mode) == 0o700


def test_partial_corrupt_and_linked_checkpoints_are_passed_over_with_a_log(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    host = Path(store.directory("ns", "job-1"))

    def put(name: str, text: str, when: int, digest: str | None = None) -> None:
        (host / name).write_text(text)
        os.utime(host / name, (when, when))
        if digest is not None:
            (host / f"{name}.sha256").write_text(f"{digest}  {name}\n")

    good = hashlib.sha256(b"3\n").hexdigest()
    put("ckpt-3", "3\n", 100, good)                             # sealed and whole: the one to resume from
    put("ckpt-4", "4\n", 200)                                   # no digest: taken on its word ...
    assert store.newest(str(host)) == "ckpt-4"
    put("ckpt-5", "5", 300, hashlib.sha256(b"5\n").hexdigest())  # cut short after its digest
    put("ckpt-6", "", 400)                                      # empty
    put("ckpt-7", "7\n", 500, "not a digest")                   # a digest file without a digest
    (host / "ckpt-8").symlink_to("/etc/hostname")               # a tenant's link out of its directory
    os.utime(host / "ckpt-8", (600, 600), follow_symlinks=False)
    (host / "ckpt-9").mkdir()
    caplog.set_level(logging.WARNING)
    assert store.newest(str(host)) == "ckpt-4"
    said = {r.getMessage().split(" ignored: ")[0].rsplit("/", 1)[1]: r.getMessage() for r in caplog.records
            if " ignored: " in r.getMessage()}
    assert set(said) == {"ckpt-5", "ckpt-6", "ckpt-7", "ckpt-8", "ckpt-9"}, caplog.text
    assert "partial or corrupt" in said["ckpt-5"] and "empty" in said["ckpt-6"] and "no SHA-256" in said["ckpt-7"]
    assert "not a regular file" in said["ckpt-8"]
    (host / "ckpt-4").unlink()
    assert store.newest(str(host)) == "ckpt-3"
    wrapped = CheckpointEnforcement(NoEnforcement(), store, LendingPods(LEND).get)
    for junk in ("ckpt-3", "ckpt-3.sha256"):
        (host / junk).unlink()
    extras = wrapped.grant_extras(PodView("ns", "job-1", "u", "n1", 0.0, False, ()), "c")  # key ns/job-1: other dir
    assert contract.RESUME_FROM_ENV not in extras.envs


def test_a_finished_criu_dump_directory_is_resumed_from_and_unfinished_ones_are_passed_over(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """criu-run's process dumps are directories (docs/lending.md): one counts only when it is named
    criu-<n>, is no link, and holds CRIU's non-empty inventory.img."""
    store = CheckpointStore(str(tmp_path / "ckpt"))
    host = Path(store.directory("ns", "job-1"))

    def dump(name: str, when: int, inventory: bytes | None = b"\x01") -> None:
        (host / name).mkdir()
        if inventory is not None:
            (host / name / "inventory.img").write_bytes(inventory)
        os.utime(host / name, (when, when))

    (host / "ckpt-3").write_text("3\n")
    os.utime(host / "ckpt-3", (100, 100))
    dump("criu-1", 200)                        # finished: newer than the application's checkpoint
    dump(".criu-2", 300)                       # being written (dot name)
    dump("criu-3", 400, inventory=None)        # cut short: no inventory
    dump("criu-4", 500, inventory=b"")         # an empty inventory
    dump("dumps", 600)                         # some other directory
    (host / "criu-5").symlink_to(host / "criu-1")  # a link to a dump is not one
    os.utime(host / "criu-5", (700, 700), follow_symlinks=False)
    caplog.set_level(logging.WARNING)
    assert store.newest(str(host)) == "criu-1"
    said = {r.getMessage().split(" ignored: ")[0].rsplit("/", 1)[1]: r.getMessage() for r in caplog.records
            if " ignored: " in r.getMessage()}
    assert set(said) == {"criu-3", "criu-4", "dumps", "criu-5"}, caplog.text
    assert "without CRIU's inventory.img" in said["criu-3"] and "not a non-empty regular file" in said["criu-4"]
    assert "not a process dump" in said["dumps"] and "not a regular file" in said["criu-5"]
    extras = store.extras("ns", "job-1")
    assert extras.envs[contract.RESUME_FROM_ENV] == f"{contract.CHECKPOINT_MOUNT}/criu-1"
    shutil.rmtree(host / "criu-1")
    assert store.newest(str(host)) == "ckpt-3"


def test_an_unreadable_directory_resumes_from_nothing_and_never_raises(tmp_path: Path) -> None:
    assert CheckpointStore.newest(str(tmp_path / "missing")) is None


def test_a_pod_the_lending_side_never_saw_gets_a_directory_of_its_own_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The fallback to namespace/name loses the task's checkpoints (issue 26), so it is never silent."""
    wrapped = CheckpointEnforcement(NoEnforcement(), CheckpointStore(str(tmp_path)), LendingPods(LEND).get)
    caplog.set_level(logging.WARNING)
    assert host_dir(wrapped.grant_extras(view("w"), "c")).name.startswith("ns_w-")
    assert "pod ns/w is unknown to the lending side" in caplog.text
