"""Runs NVIDIA's MPS control daemon as a child of the agent and restarts it when it dies.

Run in the foreground (``nvidia-cuda-mps-control -f``), not daemonised (``-d``): ``-d`` forks away
at once, so its exit says nothing about the daemon and its death would only be found by polling
the pid file; as our child its death wakes the supervisor at once. Its pipe and log directories
come from ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` in its environment, the host
directories the agent also mounts into every container with a share.

A daemon that dies is started again after a delay that doubles from :data:`FIRST_BACKOFF_S` up to
:data:`MAX_BACKOFF_S` and returns to the first delay once a run lasted :data:`STABLE_AFTER_S`.
Stopping sends SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

DEFAULT_MPS_CONTROL = "nvidia-cuda-mps-control"
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
STABLE_AFTER_S = 60.0
STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class MpsDaemonState:
    """What the supervisor knows now: whether the daemon runs, its pid, restarts, last exit."""

    running: bool
    pid: int | None
    starts: int
    last_exit: str


def backoff_after(previous: float, ran_s: float, first: float = FIRST_BACKOFF_S,
                  most: float = MAX_BACKOFF_S, stable_after: float = STABLE_AFTER_S) -> float:
    """The delay before the next start, given the last delay and how long the last run lasted."""
    if ran_s >= stable_after or previous <= 0:
        return first
    return min(most, previous * 2)


class MpsDaemonSupervisor:
    """Keeps one ``nvidia-cuda-mps-control -f`` running while :meth:`run` runs."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str],
                 first_backoff_s: float = FIRST_BACKOFF_S, max_backoff_s: float = MAX_BACKOFF_S,
                 stable_after_s: float = STABLE_AFTER_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.command = list(command)
        self.env = dict(env)
        self._first, self._most, self._stable = first_backoff_s, max_backoff_s, stable_after_s
        self._clock = clock
        self._proc: asyncio.subprocess.Process | None = None
        self._starts = 0
        self._last_exit = ""

    def state(self) -> MpsDaemonState:
        proc = self._proc
        running = proc is not None and proc.returncode is None
        return MpsDaemonState(running, proc.pid if running and proc else None, self._starts, self._last_exit)

    async def run(self) -> None:
        """Start, wait, restart with backoff; until cancelled (then the daemon is stopped)."""
        delay = 0.0
        try:
            while True:
                started = self._clock()
                try:
                    self._proc = await asyncio.create_subprocess_exec(
                        *self.command, env={**os.environ, **self.env},
                        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                        stderr=asyncio.subprocess.DEVNULL)
                except OSError as exc:
                    self._proc = None
                    self._last_exit = f"cannot start {self.command[0]}: {exc.strerror or exc}"
                else:
                    self._starts += 1
                    log.info("MPS control daemon started (pid %d)", self._proc.pid)
                    code = await self._proc.wait()
                    self._last_exit = f"exited with status {code}"
                delay = backoff_after(delay, self._clock() - started, self._first, self._most, self._stable)
                log.error("MPS control daemon %s; starting it again in %.1f s", self._last_exit, delay)
                await asyncio.sleep(delay)
        finally:
            await self._stop()

    async def _stop(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        log.info("MPS control daemon stopped")
