"""The MPS backend: the agent runs the control daemon (a stand-in script here), restarts it with
backoff when it dies, stops it with the agent; grants name and mount its directories."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from pathlib import Path

import pytest

from gpupool.api import environment as env
from gpupool.nodeagent.isolation.backends import IsolationBackend
from gpupool.nodeagent.isolation.dmem import DmemStatus
from gpupool.nodeagent.isolation.mps_backend import MpsEnforcement, MpsLayout, daemon_command
from gpupool.nodeagent.isolation.mps_daemon import MpsDaemonSupervisor, backoff_after
from gpupool.nodeagent.types import Mount, PodView

POD = PodView("ns", "p", "uid-1", "node-a", 0.0, False, ())


def stand_in(tmp_path: Path) -> Path:
    """A daemon that records its arguments and directories, one line per start, and runs until killed."""
    script = tmp_path / "nvidia-cuda-mps-control"
    record = tmp_path / "starts.log"
    script.write_text(f"""#!{sys.executable}
import os, sys, time
with open({str(record)!r}, "a") as fh:
    fh.write(f"{{os.getpid()}} {{' '.join(sys.argv[1:])}} {{os.environ['CUDA_MPS_PIPE_DIRECTORY']}} "
             f"{{os.environ['CUDA_MPS_LOG_DIRECTORY']}}\\n")
time.sleep(3600)
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def starts(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "starts.log"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


async def until(condition: object, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(("previous", "ran", "expected"), [
    pytest.param(0.0, 0.1, 1.0, id="first-failure"),
    pytest.param(1.0, 0.1, 2.0, id="doubles"),
    pytest.param(32.0, 0.1, 60.0, id="capped"),
    pytest.param(60.0, 61.0, 1.0, id="a-stable-run-resets"),
])
def test_backoff(previous: float, ran: float, expected: float) -> None:
    assert backoff_after(previous, ran) == expected


def test_the_daemon_is_started_restarted_when_it_dies_and_stopped_with_the_agent(tmp_path: Path) -> None:
    layout = MpsLayout(str(tmp_path / "state"))
    supervisor = MpsDaemonSupervisor(*daemon_command(layout, str(stand_in(tmp_path))), first_backoff_s=0.05)
    mps = MpsEnforcement(layout, "unused", DmemStatus(False, "no dmem"), supervisor)

    async def main() -> None:
        task = asyncio.create_task(mps.run(lambda: {}))
        await until(lambda: len(starts(tmp_path)) == 1 and mps.state().enforcing)
        [first] = starts(tmp_path)
        assert first[1:] == ["-f", layout.pipe_dir, layout.log_dir]
        assert mps.state().backend is IsolationBackend.MPS
        os.kill(int(first[0]), signal.SIGKILL)
        await until(lambda: not mps.state().enforcing)
        assert "exited with status -9" in mps.state().detail
        await until(lambda: len(starts(tmp_path)) == 2 and mps.state().enforcing)
        second = int(starts(tmp_path)[1][0])
        assert mps.supervisor.state().starts == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not Path(f"/proc/{second}").exists() or _zombie(second)

    asyncio.run(main())


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


def test_a_missing_binary_is_retried_and_reported(tmp_path: Path) -> None:
    supervisor = MpsDaemonSupervisor([str(tmp_path / "absent")], {}, first_backoff_s=0.01, max_backoff_s=0.02)

    async def main() -> None:
        task = asyncio.create_task(supervisor.run())
        await until(lambda: "cannot start" in supervisor.state().last_exit)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(main())
    assert supervisor.state().starts == 0 and not supervisor.state().running


def test_the_grant_names_and_mounts_the_daemon_directories(tmp_path: Path) -> None:
    layout = MpsLayout(str(tmp_path))
    mps = MpsEnforcement(layout, "nvidia-cuda-mps-control", DmemStatus(True, "1 NVIDIA region"))
    extras = mps.grant_extras(POD, "main")
    assert extras.envs == {env.MPS_PIPE_DIRECTORY: "/tmp/nvidia-mps", env.MPS_LOG_DIRECTORY: "/var/log/nvidia-mps"}
    assert extras.mounts == (Mount(layout.pipe_dir, "/tmp/nvidia-mps", read_only=False),
                             Mount(layout.log_dir, "/var/log/nvidia-mps", read_only=True))
    assert os.path.isdir(layout.pipe_dir) and os.path.isdir(layout.log_dir)
    state = mps.state()
    assert not state.enforcing and "not running" in state.detail and "memory also by dmem" in state.detail
