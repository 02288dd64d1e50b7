"""SIGTERM stops the node agent with its clean-ups run (gpupool/nodeagent/termination.py): the
program the agent runs (here its remote GPU server's supervisor, :class:`ServerProcess`) is stopped
before the agent exits, instead of being left running by a process killed outright."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpupool.nodeagent.termination import run_until_terminated

REPO = Path(__file__).resolve().parents[2]

AGENT = textwrap.dedent("""
    import asyncio, sys
    from gpupool.nodeagent.remote_serving import ServerProcess
    from gpupool.nodeagent.termination import run_until_terminated
    child = "import sys, os, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
    server = ServerProcess([sys.executable, "-c", child, sys.argv[1]])
    {run}
    print("exited cleanly", flush=True)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _sigterm_agent(tmp_path: Path, run: str) -> tuple[subprocess.CompletedProcess[str] | None, int]:
    """Start an "agent" running ``run``, SIGTERM it once its child runs; its result (None: it did not
    exit within 15 s) and the child's pid. Its output goes to a file: a child left running would hold
    a pipe open."""
    pid_file, output = tmp_path / "child.pid", tmp_path / "agent.log"
    with output.open("w") as out:
        agent = subprocess.Popen([sys.executable, "-c", AGENT.format(run=run), str(pid_file)], stdout=out,
                                 stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()):
        assert agent.poll() is None and time.monotonic() < deadline, output.read_text()
        time.sleep(0.05)
    child = int(pid_file.read_text())
    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(timeout=15)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()
        return None, child
    return subprocess.CompletedProcess(agent.args, agent.returncode, output.read_text()), child


def test_sigterm_stops_the_program_the_agent_runs_before_the_agent_exits(tmp_path: Path) -> None:
    done, child = _sigterm_agent(tmp_path, "asyncio.run(run_until_terminated(server.run()))")
    try:
        assert done is not None and (done.returncode, done.stdout.strip()) == (0, "exited cleanly"), done
        assert not _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_without_it_sigterm_leaves_the_program_running(tmp_path: Path) -> None:
    """What the agent did before: the child outlives it (this is the failure the helper prevents)."""
    done, child = _sigterm_agent(tmp_path, "asyncio.run(server.run())")
    try:
        assert done is not None and done.returncode == -signal.SIGTERM
        assert _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_main_that_ends_returns_and_other_cancellations_and_errors_go_through() -> None:
    async def ends() -> None:
        await asyncio.sleep(0)

    async def fails() -> None:
        raise ValueError("broken")

    async def cancelled_from_outside() -> None:
        outer = asyncio.ensure_future(run_until_terminated(asyncio.sleep(60)))
        await asyncio.sleep(0.05)
        outer.cancel()
        await outer

    asyncio.run(run_until_terminated(ends()))
    with pytest.raises(ValueError, match="broken"):
        asyncio.run(run_until_terminated(fails()))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancelled_from_outside())
