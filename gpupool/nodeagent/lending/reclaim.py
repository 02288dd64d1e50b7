"""Reclaiming a pod's GPU: checkpoint signal, deadline, SIGKILL, then eviction with a readable reason.

The order is the contract's (docs/lending.md): every process of the pod gets the checkpoint signal
(``SIGUSR1``: write your checkpoint into ``$GPUPOOL_CHECKPOINT_DIR`` and exit); whatever still runs
at the deadline gets ``SIGKILL`` (first, where the node has ``cuda-checkpoint``, its CUDA state is
suspended so its device memory is released at once: :mod:`~gpupool.nodeagent.lending.cuda_suspend`),
and so does anything that appears in the pod afterwards (a
restarted container) until the processes are gone; then ``on_stopped`` runs (the lending service
withdraws the lent devices and republishes what is lendable: the card is back with its owner);
then the pod is evicted through the Eviction API (deleted if eviction is refused) and gets a Warning
event with reason ``GpuReclaimed``, so its controller makes a new pod and a user reads why.

One reclaim per pod at a time: asking again while one is in flight returns the running one.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from gpupool.api.lending import DEFAULT_CHECKPOINT_DEADLINE_S, RECLAIMED_REASON
from gpupool.nodeagent.lending.cuda_suspend import Suspension
from gpupool.nodeagent.lending.processes import PodProcesses, ProcessControl
from gpupool.nodeagent.lending.rules import PodKey

log = logging.getLogger(__name__)

CHECKPOINT_SIGNAL = signal.SIGUSR1
POLL_SECONDS = 0.05
KILL_SETTLE_SECONDS = 5.0
"""How long SIGKILLed processes may take to disappear before the reclaim goes on regardless."""


class PodEvictor(Protocol):
    """The API side of a reclaim."""

    async def evict(self, namespace: str, name: str) -> str:
        """Evict the pod (delete it when eviction is refused); says which happened."""
        ...

    async def warn(self, namespace: str, name: str, reason: str, message: str) -> None:
        """Post a Warning event about the pod."""
        ...


class CudaSuspender(Protocol):
    """Suspends the CUDA state of processes about to be killed (``cuda-checkpoint``); never raises and
    returns within its own bound."""

    async def suspend(self, pids: Iterable[int]) -> dict[int, Suspension]:
        ...


@dataclass(frozen=True)
class ReclaimOrder:
    """Which pod, whose processes, why, and how long it has to write its checkpoint."""

    pod: PodKey
    processes: PodProcesses
    why: str
    deadline_s: float = DEFAULT_CHECKPOINT_DEADLINE_S


@dataclass(frozen=True)
class ReclaimResult:
    """How a reclaim went: processes signalled and killed, seconds until they were gone, the API
    outcome (``evicted``, ``deleted``, ``gone`` or the error), and how many of the processes left at
    the deadline had their CUDA state suspended before the kill."""

    pod: PodKey
    signalled: int
    killed: int
    stopped_s: float
    api: str
    suspended: int = 0


StoppedHook = Callable[[PodKey], Awaitable[None]]


class Reclaimer:
    """Runs reclaims as tasks on the agent's event loop; :meth:`reclaim` must be called on it."""

    def __init__(self, processes: ProcessControl, evictor: PodEvictor, *, on_stopped: StoppedHook | None = None,
                 on_done: Callable[[ReclaimResult], None] | None = None, poll_s: float = POLL_SECONDS,
                 clock: Callable[[], float] = time.monotonic, suspender: CudaSuspender | None = None) -> None:
        self._processes = processes
        self._evictor = evictor
        self._on_stopped = on_stopped
        self._on_done = on_done
        self._poll = poll_s
        self._clock = clock
        self._suspender = suspender
        self.in_flight: dict[PodKey, asyncio.Task[ReclaimResult]] = {}
        self.results: list[ReclaimResult] = []

    def reclaim(self, order: ReclaimOrder) -> asyncio.Task[ReclaimResult]:
        """Start reclaiming ``order.pod`` (or return the reclaim already running for it)."""
        running = self.in_flight.get(order.pod)
        if running is not None:
            return running
        task = asyncio.get_running_loop().create_task(self._run(order))
        self.in_flight[order.pod] = task
        return task

    async def _run(self, order: ReclaimOrder) -> ReclaimResult:
        namespace, name = order.pod
        try:
            log.warning("reclaiming the GPU of %s/%s: %s", namespace, name, order.why)
            signalled, killed, stopped_s, suspended = await self.stop(order)
            if self._on_stopped is not None:
                try:
                    await self._on_stopped(order.pod)
                except Exception:
                    log.exception("after stopping %s/%s: updating the lent devices failed", namespace, name)
            message = (f"GPU reclaimed: {order.why}. {signalled} process(es) got {CHECKPOINT_SIGNAL.name} "
                       f"to write a checkpoint within {order.deadline_s:g} s, {killed} killed after the deadline")
            if suspended:
                message += f" ({suspended} with their CUDA state suspended by cuda-checkpoint first)"
            try:
                await self._evictor.warn(namespace, name, RECLAIMED_REASON, message)
            except Exception as exc:
                log.warning("could not post %s on %s/%s: %s", RECLAIMED_REASON, namespace, name, exc)
            try:
                api = await self._evictor.evict(namespace, name)
            except Exception as exc:  # the processes are gone either way; the pod shows why
                log.error("could not evict %s/%s: %s", namespace, name, exc)
                api = f"error: {exc}"
            result = ReclaimResult(order.pod, signalled, killed, stopped_s, api, suspended)
            self.results.append(result)
            log.warning("reclaimed %s/%s: %d signalled, %d killed, stopped in %.2f s, %s", namespace, name,
                        signalled, killed, stopped_s, api)
            if self._on_done is not None:
                self._on_done(result)
            return result
        finally:
            self.in_flight.pop(order.pod, None)

    async def stop(self, order: ReclaimOrder) -> tuple[int, int, float, int]:
        """Signal, wait up to the deadline, suspend the CUDA state of what is left, kill it;
        (signalled, killed, seconds, suspended)."""
        began = self._clock()
        pids = await asyncio.to_thread(self._processes.pids, order.processes)
        for pid in pids:
            self._processes.send(pid, CHECKPOINT_SIGNAL)
        deadline = began + order.deadline_s
        left = pids
        while left and self._clock() < deadline:
            await asyncio.sleep(self._poll)
            left = await asyncio.to_thread(self._processes.pids, order.processes)
        suspended = 0
        if left and self._suspender is not None:
            try:
                outcomes = await self._suspender.suspend(left)
            except Exception:  # the kill below ends them regardless
                log.exception("suspending the CUDA state of %s/%s failed", *order.pod)
                outcomes = {}
            suspended = sum(1 for o in outcomes.values() if o is Suspension.SUSPENDED)
            left = await asyncio.to_thread(self._processes.pids, order.processes)
        killed: set[int] = set()
        settle = self._clock() + KILL_SETTLE_SECONDS
        while left:
            for pid in left - killed:
                self._processes.send(pid, signal.SIGKILL)
            killed |= left
            if self._clock() >= settle:
                log.error("processes %s of %s/%s outlived SIGKILL for %g s", sorted(left), *order.pod,
                          KILL_SETTLE_SECONDS)
                break
            await asyncio.sleep(self._poll)
            left = await asyncio.to_thread(self._processes.pids, order.processes)
        return len(pids), len(killed), self._clock() - began, suspended
