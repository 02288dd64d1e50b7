"""Suspending a reclaimed process's CUDA state with NVIDIA's ``cuda-checkpoint`` before it is killed.

A borrower that did not exit by the checkpoint protocol's deadline is killed. Before that, where
the node has ``cuda-checkpoint`` (driver 550+), each of its remaining processes is asked for its
CUDA state and, when it is ``running``, toggled to ``checkpointed``:

    cuda-checkpoint --get-state --pid <host pid>      prints running | locked | checkpointed | failed
    cuda-checkpoint --toggle --pid <host pid>         running -> checkpointed (or back)

A checkpointed process has finished its submitted work, copied its device memory into host memory
and released every GPU resource, so the owner has the card's memory back when the toggle returns,
not when the killed process's teardown in the driver is done. The state is read first because
``--toggle`` of a process that is already checkpointed would restore it onto the card. A process
that is not a CUDA process (a shell, a data loader) fails ``--get-state`` and is left alone.

Every call is bounded: the whole stage for one reclaim gets ``timeout_s``; a tool still running then
is killed (``cuda-checkpoint`` waits for submitted work and can hang on a locked peer, NVIDIA's
issue 30), and the reclaim goes on to ``SIGKILL`` whatever happened. Nothing here raises.

A pod under ``criu-run`` suspends its CUDA processes itself, around its CRIU dump (docs/lending.md,
"GPU state under criu-run"). While that is under way one of the pod's processes is criu-run's
``cuda-checkpoint`` or ``criu``: the stage then leaves the whole pod alone, so no process is toggled
by both (a second toggle of a checkpointed process would put it back on the card, and a process
CRIU holds stopped cannot answer). A criu-run whose dump failed has toggled its processes back and
runs no such helper: the stage treats it as any other pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

log = logging.getLogger(__name__)

DEFAULT_CUDA_CHECKPOINT_TIMEOUT_S = 2.0
KILL_WAIT_S = 0.5
"""How long a killed tool may take to exit before it is left to the event loop's child watcher."""
RUNNING = "running"
CHECKPOINTED = "checkpointed"
CHECKPOINT_HELPERS = frozenset({"criu", "cuda-checkpoint"})
"""Process names (``/proc/<pid>/comm``) that mean a checkpoint of the pod's own is under way."""


def command_name(pid: int) -> str:
    """The process's name (its ``comm``), or ``""`` when it is gone."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as comm:
            return comm.read().strip()
    except OSError:
        return ""


class Suspension(StrEnum):
    """What happened to one process."""

    SUSPENDED = "suspended"
    """It was running and is checkpointed now: its device memory is released."""
    ALREADY = "already"
    """It was checkpointed already."""
    SKIPPED = "skipped"
    """Not a CUDA process, or in a state the tool should not touch (locked, failed)."""
    FAILED = "failed"
    """The toggle failed."""
    TIMED_OUT = "timed-out"
    """The tool did not answer within the stage's time."""


@dataclass(frozen=True)
class ToolRun:
    """One run of the tool: its exit status (``None``: killed at the deadline) and what it printed."""

    status: int | None
    output: str


class CudaCheckpoint:
    """Runs ``cuda-checkpoint`` at ``path`` for the processes a reclaim is about to kill."""

    def __init__(self, path: str, timeout_s: float = DEFAULT_CUDA_CHECKPOINT_TIMEOUT_S,
                 name_of: Callable[[int], str] = command_name) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._name_of = name_of

    async def suspend(self, pids: Iterable[int]) -> dict[int, Suspension]:
        """Suspend every process in ``pids`` that runs CUDA, all at once, within ``timeout_s`` in all;
        none where one of them is a checkpoint helper (the pod's ``criu-run`` is suspending them)."""
        ordered = sorted(set(pids))
        helpers = sorted(pid for pid in ordered if self._name_of(pid) in CHECKPOINT_HELPERS)
        if helpers:
            log.warning("cuda-checkpoint before the kill: not run, the pod's own checkpoint is under way "
                        "(processes %s are criu or cuda-checkpoint)", helpers)
            return dict.fromkeys(ordered, Suspension.SKIPPED)
        deadline = time.monotonic() + self.timeout_s
        outcomes = await asyncio.gather(*(self._one(pid, deadline) for pid in ordered))
        result = dict(zip(ordered, outcomes, strict=True))
        if any(o is not Suspension.SKIPPED for o in outcomes):
            log.warning("cuda-checkpoint before the kill: %s",
                        ", ".join(f"pid {p} {o}" for p, o in result.items()))
        return result

    async def _one(self, pid: int, deadline: float) -> Suspension:
        state = await self._run(("--get-state", "--pid", str(pid)), deadline)
        if state.status is None:
            return Suspension.TIMED_OUT
        said = state.output.strip().lower()
        if state.status != 0:
            return Suspension.SKIPPED
        if CHECKPOINTED in said:
            return Suspension.ALREADY
        if RUNNING not in said:
            return Suspension.SKIPPED
        toggled = await self._run(("--toggle", "--pid", str(pid)), deadline)
        if toggled.status is None:
            return Suspension.TIMED_OUT
        if toggled.status != 0:
            log.warning("cuda-checkpoint --toggle --pid %d failed (%d): %s", pid, toggled.status,
                        toggled.output.strip()[:200])
            return Suspension.FAILED
        return Suspension.SUSPENDED

    async def _run(self, args: tuple[str, ...], deadline: float) -> ToolRun:
        left = deadline - time.monotonic()
        if left <= 0:
            return ToolRun(None, "")
        try:
            proc = await asyncio.create_subprocess_exec(self.path, *args, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT)
        except OSError as exc:
            log.warning("cannot run %s: %s", self.path, exc)
            return ToolRun(-1, str(exc))
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), left)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), KILL_WAIT_S)
            log.warning("%s %s: no answer within %g s; killed", self.path, " ".join(args), self.timeout_s)
            return ToolRun(None, "")
        return ToolRun(proc.returncode, out.decode("utf-8", errors="replace"))
