"""--criu: the host directory of CRIU, criu-run and CRIU's kernel cache, and its mount into the grants
of pods annotated ``gpupool.io/checkpoint: process`` (docs/lending.md, "Process checkpoints with CRIU")."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from pathlib import Path

import pytest

from gpupool.api import lending as contract
from gpupool.nodeagent.isolation.backends import NoEnforcement
from gpupool.nodeagent.lending.checkpoint import CheckpointEnforcement, CheckpointStore
from gpupool.nodeagent.lending.criu_tools import CRIU_ENV, CRIU_MOUNT, prepare_criu_tools
from gpupool.nodeagent.lending.cuda_suspend import CudaCheckpoint, Suspension
from gpupool.nodeagent.lending.pods import LendingPods
from gpupool.nodeagent.types import Mount, PodView
from gpupool.shim.build import ShimBuildError, find_compiler
from tests.nodeagent.lending.support import LEND, decoded, pod_json
from tests.nodeagent.lending.test_cuda_suspend import NO_SUCH_PID, calls, stand_in

#: A stand-in CRIU whose `check` writes the kernel cache where CRIU writes it (unless NO_CACHE).
FAKE_CRIU = """#!/bin/sh
[ "$1 $2" = "check --unprivileged" ] || exit 1
[ -n "$NO_CACHE" ] || printf kdat > "$XDG_RUNTIME_DIR/criu.kdat"
echo "Looks good."
"""


@pytest.fixture
def criu(tmp_path: Path) -> Path:
    try:
        find_compiler()
    except ShimBuildError as exc:
        pytest.skip(f"criu-run cannot be built here: {exc}")
    path = tmp_path / "criu-4.1.1"
    path.write_text(FAKE_CRIU)
    path.chmod(0o755)
    return path


def test_the_tools_directory_gets_criu_criu_run_and_the_kernel_cache(
        criu: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tools = tmp_path / "run" / "criu"
    (tmp_path / "run").mkdir()
    caplog.set_level(logging.INFO)
    assert prepare_criu_tools(str(criu), str(tools)) == str(tools)
    assert sorted(p.name for p in tools.iterdir()) == ["criu", "criu-run", "criu.kdat"]
    assert (tools / "criu").read_text() == FAKE_CRIU and (tools / "criu-run").stat().st_mode & 0o111
    assert "needs the CHECKPOINT_RESTORE capability" in caplog.text


def test_without_the_kernel_cache_the_start_says_sys_admin_is_needed(
        criu: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "criu"
    tools.mkdir()
    (tools / "criu.kdat").write_text("a stale cache from another kernel")
    monkeypatch.setenv("NO_CACHE", "1")
    assert prepare_criu_tools(str(criu), str(tools)) == str(tools)
    assert not (tools / "criu.kdat").exists()
    assert "needs SYS_ADMIN as well" in caplog.text and "Looks good." in caplog.text


def test_a_criu_that_cannot_be_copied_leaves_process_checkpoints_off(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert prepare_criu_tools(str(tmp_path / "missing"), str(tmp_path / "criu")) is None
    assert "process checkpoints are off" in caplog.text


def test_only_a_pod_asking_for_process_checkpoints_gets_the_tools_mounted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    feed = LendingPods(LEND)
    feed.on_list(decoded(pod_json("criu", annotations={LEND.checkpoint: contract.PROCESS_CHECKPOINT}),
                         pod_json("plain"), pod_json("other", annotations={LEND.checkpoint: "application"})))
    tools = tmp_path / "tools"

    def view(name: str) -> PodView:
        return PodView("ns", name, f"uid-{name}", "n1", 0.0, False, ())

    agent = CheckpointEnforcement(NoEnforcement(), CheckpointStore(str(tmp_path / "ckpt")), feed.get, str(tools))
    granted = agent.grant_extras(view("criu"), "c")
    assert Mount(str(tools), CRIU_MOUNT, read_only=True) in granted.mounts and len(granted.mounts) == 2
    assert granted.envs[CRIU_ENV] == f"{CRIU_MOUNT}/criu"
    assert contract.CHECKPOINT_DIR_ENV in granted.envs  # the protocol as for every pod
    for name in ("plain", "other"):
        extras = agent.grant_extras(view(name), "c")
        assert len(extras.mounts) == 1 and CRIU_ENV not in extras.envs
    without = CheckpointEnforcement(NoEnforcement(), CheckpointStore(str(tmp_path / "ckpt")), feed.get)
    extras = without.grant_extras(view("criu"), "c")
    assert len(extras.mounts) == 1 and CRIU_ENV not in extras.envs
    assert "asks for process checkpoints but the agent has no --criu" in caplog.text


def test_the_agents_cuda_checkpoint_is_copied_beside_criu_and_an_old_copy_removed_without_one(
        criu: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """criu-run finds it there (beside CRIU) and suspends the pod's CUDA processes around its dump."""
    caplog.set_level(logging.INFO)
    tool = tmp_path / "bin" / "cuda-checkpoint"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho running\n")
    tools = tmp_path / "criu"
    assert prepare_criu_tools(str(criu), str(tools), str(tool)) == str(tools)
    assert sorted(p.name for p in tools.iterdir()) == ["criu", "criu-run", "criu.kdat", "cuda-checkpoint"]
    assert (tools / "cuda-checkpoint").read_text() == tool.read_text()
    assert (tools / "cuda-checkpoint").stat().st_mode & 0o111 and "needs glibc and libcuda.so.1" in caplog.text
    assert prepare_criu_tools(str(criu), str(tools)) == str(tools)  # the next start finds no tool
    assert not (tools / "cuda-checkpoint").exists() and "cannot be dumped" in caplog.text


def test_the_agents_stage_leaves_a_pod_alone_while_its_criu_run_checkpoints_it(tmp_path: Path) -> None:
    """A process of the pod named criu or cuda-checkpoint: criu-run is toggling or dumping, so the
    agent's stage before the kill toggles nothing (never twice, never a process CRIU holds stopped)."""
    tool, log = stand_in(tmp_path, "running")
    helper = tmp_path / "helpers" / "criu"  # criu-run's CRIU, still dumping: a script's name is its file's
    helper.parent.mkdir()
    helper.write_text("#!/bin/sh\nsleep 10\n")
    helper.chmod(0o755)
    with subprocess.Popen([str(helper)]) as running:
        try:
            deadline = time.monotonic() + 5
            comm = Path(f"/proc/{running.pid}/comm")
            while comm.read_text().strip() != "criu" and time.monotonic() < deadline:
                time.sleep(0.01)
            outcome = asyncio.run(CudaCheckpoint(tool, 2.0).suspend([running.pid, NO_SUCH_PID]))
        finally:
            running.kill()
    assert outcome == {running.pid: Suspension.SKIPPED, NO_SUCH_PID: Suspension.SKIPPED}
    assert calls(log) == []
    # the same pod once criu-run's dump failed (no helper left): today's stage
    assert asyncio.run(CudaCheckpoint(tool, 2.0).suspend([NO_SUCH_PID])) == {NO_SUCH_PID: Suspension.SUSPENDED}
