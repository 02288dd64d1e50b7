"""``cuda-checkpoint`` before the kill, with a stand-in tool that records its arguments: the state is
read before a toggle, a tool that fails or hangs never holds a reclaim past its bound."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from gpupool.nodeagent.lending.cuda_suspend import CudaCheckpoint, Suspension
from gpupool.nodeagent.lending.reclaim import Reclaimer, ReclaimOrder
from tests.nodeagent.lending.test_reclaim import TARGET, Api, Children, wait_started

#: A pid no process can have (above the kernel's pid_max): the stand-in's "alive" probe must never
#: find it, as it did once for a fixed 4242 that a process of the loaded machine happened to hold.
NO_SUCH_PID = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
GET_STATE, TOGGLE = f"--get-state --pid {NO_SUCH_PID}", f"--toggle --pid {NO_SUCH_PID}"
STATES = ("running", "checkpointed", "not-cuda", "toggle-fails", "hangs", "toggle-hangs")
TOOL = """#!/bin/sh
echo "$*" >> {log}
mode={mode}
case "$1" in
--get-state)
    case $mode in
    hangs) exec sleep 30 ;;
    not-cuda) echo "cuda-checkpoint: pid $3 is not a CUDA process" >&2; exit 1 ;;
    checkpointed) echo checkpointed ;;
    *) echo running ;;
    esac ;;
--toggle)
    if kill -0 "$3" 2>/dev/null; then echo "alive $3" >> {log}; fi
    case $mode in
    toggle-fails) echo "cuda-checkpoint: OS call failed" >&2; exit 3 ;;
    toggle-hangs) exec sleep 30 ;;
    esac ;;
esac
"""


def stand_in(tmp: Path, mode: str) -> tuple[str, Path]:
    """A ``cuda-checkpoint`` that behaves as ``mode`` says and appends its arguments to a log."""
    assert mode in STATES
    log, tool = tmp / "calls.log", tmp / "cuda-checkpoint"
    tool.write_text(TOOL.format(log=log, mode=mode))
    tool.chmod(0o755)
    return str(tool), log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize(("mode", "outcome", "expected_calls"), [
    pytest.param("running", Suspension.SUSPENDED, [GET_STATE, TOGGLE], id="running"),
    pytest.param("checkpointed", Suspension.ALREADY, [GET_STATE], id="already-checkpointed"),
    pytest.param("not-cuda", Suspension.SKIPPED, [GET_STATE], id="not-a-cuda-process"),
    pytest.param("toggle-fails", Suspension.FAILED, [GET_STATE, TOGGLE], id="toggle-fails"),
])
def test_the_state_is_read_before_a_toggle(tmp_path: Path, mode: str, outcome: Suspension,
                                           expected_calls: list[str]) -> None:
    tool, log = stand_in(tmp_path, mode)
    assert asyncio.run(CudaCheckpoint(tool, 5.0).suspend([NO_SUCH_PID])) == {NO_SUCH_PID: outcome}
    assert calls(log) == expected_calls


@pytest.mark.slow
@pytest.mark.parametrize("mode", [pytest.param("hangs", id="get-state-hangs"),
                                  pytest.param("toggle-hangs", id="toggle-hangs")])
def test_a_hanging_tool_is_killed_at_the_bound(tmp_path: Path, mode: str) -> None:
    tool, _ = stand_in(tmp_path, mode)
    began = time.monotonic()
    assert asyncio.run(CudaCheckpoint(tool, 1.0).suspend([1, 2, 3])) == dict.fromkeys((1, 2, 3), Suspension.TIMED_OUT)
    assert 1.0 <= time.monotonic() - began < 2.5  # one bound for all of them (run at once), not 1 s each


def test_a_missing_tool_is_no_error(tmp_path: Path) -> None:
    result = asyncio.run(CudaCheckpoint(str(tmp_path / "gone"), 1.0).suspend([7]))
    assert result == {7: Suspension.SKIPPED}


def reclaim(children: Children, suspender: CudaCheckpoint | None, deadline_s: float = 0.3) -> tuple[float, int, int]:
    async def go() -> tuple[float, int, int]:
        reclaimer = Reclaimer(children, Api(), poll_s=0.02, suspender=suspender)
        began = time.monotonic()
        result = await reclaimer.reclaim(ReclaimOrder(("ns", "b"), TARGET, "test", deadline_s))
        return time.monotonic() - began, result.suspended, result.killed

    return asyncio.run(go())


def start_ignoring(children: Children, tmp: Path) -> subprocess.Popen[bytes]:
    proc = children.start(tmp, IGNORE_CHECKPOINT="1")
    wait_started(proc)
    return proc


def test_a_process_past_the_deadline_is_suspended_then_killed(tmp_path: Path) -> None:
    children = Children()
    proc = start_ignoring(children, tmp_path)
    tool, log = stand_in(tmp_path, "running")
    took, suspended, killed = reclaim(children, CudaCheckpoint(tool, 2.0))
    assert (suspended, killed) == (1, 1) and took < 2.5
    assert calls(log) == [f"--get-state --pid {proc.pid}", f"--toggle --pid {proc.pid}", f"alive {proc.pid}"]
    assert proc.wait(1) == -signal.SIGKILL
    assert [sig for _, sig in children.sent] == [signal.SIGUSR1, signal.SIGKILL]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [pytest.param("hangs", id="get-state-hangs"),
                                  pytest.param("toggle-hangs", id="toggle-hangs"),
                                  pytest.param("toggle-fails", id="toggle-fails")])
def test_a_tool_that_fails_or_hangs_still_lets_the_reclaim_finish_within_its_bound(tmp_path: Path, mode: str) -> None:
    children = Children()
    proc = start_ignoring(children, tmp_path)
    tool, _ = stand_in(tmp_path, mode)
    deadline, bound = 0.3, 0.5
    took, suspended, killed = reclaim(children, CudaCheckpoint(tool, bound), deadline)
    assert (suspended, killed) == (0, 1)
    if mode == "toggle-fails":
        assert took < deadline + 1.5
    else:  # the hanging tool is cut at the bound, not waited for
        assert deadline + bound <= took < deadline + bound + 1.5
    assert proc.wait(1) == -signal.SIGKILL


def test_a_process_that_follows_the_protocol_never_meets_the_tool(tmp_path: Path) -> None:
    children = Children()
    proc = children.start(tmp_path)
    wait_started(proc)
    tool, log = stand_in(tmp_path, "running")
    _, suspended, killed = reclaim(children, CudaCheckpoint(tool, 2.0), deadline_s=5.0)
    assert (suspended, killed) == (0, 0) and calls(log) == [] and proc.wait(1) == 0


def test_a_suspender_that_raises_does_not_stop_the_kill(tmp_path: Path) -> None:
    class Broken:
        async def suspend(self, pids: Iterable[int]) -> dict[int, Suspension]:
            raise RuntimeError("driver gone")

    children = Children()
    proc = start_ignoring(children, tmp_path)

    async def go() -> int:
        result = await Reclaimer(children, Api(), poll_s=0.02, suspender=Broken()).reclaim(
            ReclaimOrder(("ns", "b"), TARGET, "test", 0.2))
        return result.killed

    assert asyncio.run(go()) == 1 and proc.wait(1) == -signal.SIGKILL
