"""Reclaim with real processes: the checkpoint signal, the deadline, SIGKILL, then the API."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpupool.api.lending import RECLAIMED_REASON
from gpupool.nodeagent.lending.processes import PodProcesses
from gpupool.nodeagent.lending.reclaim import Reclaimer, ReclaimOrder
from gpupool.shim.build import ShimBuildError
from gpupool.shim.criu_run_build import build_criu_run

WORKER = str(Path(__file__).resolve().parents[3] / "examples" / "checkpoint_worker.sh")
TARGET = PodProcesses("uid-b", frozenset({"id-b"}))


class Children:
    """:class:`ProcessControl` over child processes started by the test (a stand-in container)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.sent: list[tuple[int, signal.Signals]] = []

    def start(self, directory: Path, **env: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["sh", WORKER], env={**os.environ, "GPUPOOL_CHECKPOINT_DIR": str(directory),
                                                     "STEP_SECONDS": "0.1", **env},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def pids(self, target: PodProcesses) -> set[int]:
        return {p.pid for p in self.procs if p.poll() is None}

    def send(self, pid: int, sig: signal.Signals) -> None:
        self.sent.append((pid, sig))
        os.kill(pid, sig)

    def inits(self, pids: set[int]) -> set[int]:
        """None: the test's children share the test's pid namespace, so none is a container's process 1."""
        return set()


class Api:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    async def evict(self, namespace: str, name: str) -> str:
        self.calls.append(("evict", namespace, name))
        return "evicted"

    async def warn(self, namespace: str, name: str, reason: str, message: str) -> None:
        self.calls.append(("warn", namespace, name, reason, message))


def wait_started(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(b"started")


def test_a_worker_that_follows_the_protocol_checkpoints_and_exits_before_the_deadline(tmp_path: Path) -> None:
    children, api = Children(), Api()
    proc = children.start(tmp_path)
    wait_started(proc)
    time.sleep(0.3)
    stopped: list[float] = []

    async def on_stopped(pod: tuple[str, str]) -> None:
        stopped.append(time.monotonic())
        assert not api.calls  # the card is back before the API is asked

    async def go() -> None:
        reclaimer = Reclaimer(children, api, on_stopped=on_stopped, poll_s=0.02)
        first = reclaimer.reclaim(ReclaimOrder(("ns", "b"), TARGET, "owner ns/o opened card 0", 5.0))
        assert reclaimer.reclaim(ReclaimOrder(("ns", "b"), TARGET, "again", 5.0)) is first  # one per pod
        result = await first
        assert (result.signalled, result.killed, result.api) == (1, 0, "evicted")
        assert result.stopped_s < 2.0
        assert ("ns", "b") not in reclaimer.in_flight

    asyncio.run(go())
    assert proc.wait(1) == 0
    assert [sig for _, sig in children.sent] == [signal.SIGUSR1]
    [checkpoint] = list(tmp_path.glob("ckpt-*"))
    assert int(checkpoint.read_text()) >= 1
    assert stopped and api.calls[0][:4] == ("warn", "ns", "b", RECLAIMED_REASON)
    assert "owner ns/o opened card 0" in api.calls[0][4]
    assert api.calls[1] == ("evict", "ns", "b")


@pytest.mark.slow
def test_a_worker_ignoring_the_signal_is_killed_at_the_deadline(tmp_path: Path) -> None:
    children, api = Children(), Api()
    proc = children.start(tmp_path, IGNORE_CHECKPOINT="1")
    wait_started(proc)

    async def go() -> None:
        reclaimer = Reclaimer(children, api, poll_s=0.02)
        began = time.monotonic()
        result = await reclaimer.reclaim(ReclaimOrder(("ns", "b"), TARGET, "test", 0.5))
        took = time.monotonic() - began
        assert (result.signalled, result.killed) == (1, 1)
        assert 0.5 <= took < 2.5

    asyncio.run(go())
    assert proc.wait(1) == -signal.SIGKILL
    assert [sig for _, sig in children.sent] == [signal.SIGUSR1, signal.SIGKILL]
    assert not list(tmp_path.glob("ckpt-*"))


@pytest.mark.parametrize("status", [pytest.param("error", id="api-down")])
def test_an_api_failure_still_ends_the_reclaim(tmp_path: Path, status: str) -> None:
    children = Children()

    class Down(Api):
        async def evict(self, namespace: str, name: str) -> str:
            raise RuntimeError("apiserver unreachable")

    async def go() -> None:
        result = await Reclaimer(children, Down(), poll_s=0.02).reclaim(ReclaimOrder(("ns", "b"), TARGET, "t", 1))
        assert result.api.startswith(status) and result.signalled == 0

    asyncio.run(go())


FAKE_CRIU = """#!/bin/sh
[ "$1" = dump ] || exit 1
while [ $# -gt 0 ]; do case "$1" in -t) pid=$2; shift;; -D) dir=$2; shift;; esac; shift; done
printf inv > "$dir/inventory.img"; kill -9 "$pid"
"""


class WrapperTree:
    """:class:`ProcessControl` over one ``criu-run`` and its descendants (a stand-in container whose
    process 1 is the wrapper)."""

    def __init__(self, wrapper: subprocess.Popen[bytes]) -> None:
        self.wrapper = wrapper
        self.sent: list[tuple[int, signal.Signals]] = []

    def pids(self, target: PodProcesses) -> set[int]:
        found, todo = set(), [self.wrapper.pid] if self.wrapper.poll() is None else []
        while todo:
            pid = todo.pop()
            found.add(pid)
            with contextlib.suppress(OSError):  # gone meanwhile
                todo += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        return found

    def send(self, pid: int, sig: signal.Signals) -> None:
        self.sent.append((pid, sig))
        os.kill(pid, sig)

    def inits(self, pids: set[int]) -> set[int]:
        return pids & {self.wrapper.pid}


def test_a_pod_under_criu_run_is_dumped_by_its_wrapper_and_its_workload_is_not_signalled(tmp_path: Path) -> None:
    """The workload has no handler for the signal: signalled itself it would end before the dump."""
    try:
        wrapper = build_criu_run(werror=True)
    except ShimBuildError as exc:
        pytest.skip(f"criu-run cannot be built here: {exc}")
    criu = tmp_path / "criu"
    criu.write_text(FAKE_CRIU)
    criu.chmod(0o755)
    ready = tmp_path / "ready"
    proc = subprocess.Popen([str(wrapper), "--criu", str(criu), "--", "sh", "-c",
                             f"touch {ready}; while :; do sleep 0.05; done"],
                            env={**os.environ, "GPUPOOL_CHECKPOINT_DIR": str(tmp_path)}, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    tree, api = WrapperTree(proc), Api()
    assert len(tree.pids(TARGET)) >= 2

    async def go() -> None:
        order = ReclaimOrder(("ns", "b"), PodProcesses("uid-b", frozenset({"id-b"}), inits_only=True), "owner", 5.0)
        result = await Reclaimer(tree, api, poll_s=0.02).reclaim(order)
        assert (result.signalled, result.killed, result.api) == (1, 0, "evicted")

    asyncio.run(go())
    assert tree.sent == [(proc.pid, signal.SIGUSR1)]
    assert proc.wait(timeout=5) == 0 and (tmp_path / "criu-1" / "inventory.img").is_file()
