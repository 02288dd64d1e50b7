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

Each step is handed to ``on_step`` as it is passed (the service writes it to the reclaim journal,
:mod:`~gpupool.nodeagent.lending.reclaim_journal`), and an order can resume from a step a previous
agent reached: a pod already signalled is not signalled again and keeps its deadline, one whose
deadline passed is killed at once, one already stopped is only evicted.
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
from gpupool.nodeagent.lending.reclaim_journal import ReclaimStep
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
    resume: ReclaimStep = ReclaimStep.RECORDED
    """The step a previous agent reached (``RECORDED``: a fresh reclaim)."""
    signalled_at: float | None = None
    """Wall-clock time a previous agent sent the checkpoint signal (the deadline counts from it)."""


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
StepHook = Callable[[PodKey, ReclaimStep, "float | None"], None]
"""Told each step a reclaim passes (and, for ``SIGNALLED``, the wall-clock time); must not raise."""


class Reclaimer:
    """Runs reclaims as tasks on the agent's event loop; :meth:`reclaim` must be called on it."""

    def __init__(self, processes: ProcessControl, evictor: PodEvictor, *, on_stopped: StoppedHook | None = None,
                 on_done: Callable[[ReclaimResult], None] | None = None, poll_s: float = POLL_SECONDS,
                 clock: Callable[[], float] = time.monotonic, suspender: CudaSuspender | None = None,
                 on_step: StepHook | None = None, wall: Callable[[], float] = time.time) -> None:
        self._processes = processes
        self._evictor = evictor
        self._on_stopped = on_stopped
        self._on_done = on_done
        self._poll = poll_s
        self._clock = clock
        self._suspender = suspender
        self._wall = wall
        self.on_step = on_step
        """Where the steps go (the lending service sets its journal here when none was given)."""
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
            if order.resume is ReclaimStep.RECORDED:
                log.warning("reclaiming the GPU of %s/%s: %s", namespace, name, order.why)
            else:
                log.warning("resuming the reclaim of %s/%s after a restart of the agent (it had reached %s): %s",
                            namespace, name, order.resume.label, order.why)
            # a resumed order still sweeps the pod: a container restarted meanwhile is killed too
            signalled, killed, stopped_s, suspended = await self.stop(order)
            self._step(order.pod, ReclaimStep.STOPPED)
            if self._on_stopped is not None:
                try:
                    await self._on_stopped(order.pod)
                except Exception:
                    log.exception("after stopping %s/%s: updating the lent devices failed", namespace, name)
            api = "evicted before the restart"
            if order.resume < ReclaimStep.EVICTED:
                api = await self._evict(order, self._message(order, signalled, killed, suspended))
                self._step(order.pod, ReclaimStep.EVICTED)
            result = ReclaimResult(order.pod, signalled, killed, stopped_s, api, suspended)
            self.results.append(result)
            log.warning("reclaimed %s/%s: %d signalled, %d killed, stopped in %.2f s, %s", namespace, name,
                        signalled, killed, stopped_s, api)
            if self._on_done is not None:
                self._on_done(result)
            return result
        finally:
            self.in_flight.pop(order.pod, None)

    @staticmethod
    def _message(order: ReclaimOrder, signalled: int, killed: int, suspended: int) -> str:
        message = (f"GPU reclaimed: {order.why}. {signalled} process(es) got {CHECKPOINT_SIGNAL.name} "
                   f"to write a checkpoint within {order.deadline_s:g} s, {killed} killed after the deadline")
        if suspended:
            message += f" ({suspended} with their CUDA state suspended by cuda-checkpoint first)"
        if order.resume is not ReclaimStep.RECORDED:
            message += f" (finished by a restarted node agent; the previous one had reached {order.resume.label})"
        return message

    async def _evict(self, order: ReclaimOrder, message: str) -> str:
        namespace, name = order.pod
        try:
            await self._evictor.warn(namespace, name, RECLAIMED_REASON, message)
        except Exception as exc:
            log.warning("could not post %s on %s/%s: %s", RECLAIMED_REASON, namespace, name, exc)
        try:
            return await self._evictor.evict(namespace, name)
        except Exception as exc:  # the processes are gone either way; the pod shows why
            log.error("could not evict %s/%s: %s", namespace, name, exc)
            return f"error: {exc}"

    def _step(self, pod: PodKey, step: ReclaimStep, at: float | None = None) -> None:
        if self.on_step is None:
            return
        try:
            self.on_step(pod, step, at)
        except Exception:  # the reclaim itself goes on
            log.exception("recording step %s of the reclaim of %s/%s failed", step.label, *pod)

    def _checkpoint_targets(self, order: ReclaimOrder, pids: set[int]) -> set[int]:
        """Who gets the checkpoint signal: every process, or each container's process 1 where the pod
        runs under ``criu-run`` (all of them when none is found: the pod then gets the plain protocol)."""
        if not order.processes.inits_only:
            return pids
        inits = self._processes.inits(pids)
        if not inits:
            log.warning("%s/%s asks for process checkpoints but no process 1 of its containers was found: "
                        "every process gets the checkpoint signal", *order.pod)
        return inits or pids

    async def stop(self, order: ReclaimOrder) -> tuple[int, int, float, int]:
        """Signal, wait up to the deadline, suspend the CUDA state of what is left, kill it;
        (signalled, killed, seconds, suspended). A resumed order skips what a previous agent did: the
        signal once sent, the wait once its deadline (counted from that signal) passed."""
        began = self._clock()
        pids = await asyncio.to_thread(self._processes.pids, order.processes)
        wait_s = order.deadline_s
        signalled: set[int] = set()
        if order.resume is ReclaimStep.RECORDED:
            signalled = self._checkpoint_targets(order, pids)
            for pid in signalled:
                self._processes.send(pid, CHECKPOINT_SIGNAL)
            self._step(order.pod, ReclaimStep.SIGNALLED, self._wall())
        elif order.resume is ReclaimStep.SIGNALLED and order.signalled_at is not None:
            wait_s = min(order.deadline_s, max(0.0, order.signalled_at + order.deadline_s - self._wall()))
        else:
            wait_s = 0.0
        deadline = began + wait_s
        left = pids
        while left and self._clock() < deadline:
            await asyncio.sleep(self._poll)
            left = await asyncio.to_thread(self._processes.pids, order.processes)
        if left:
            self._step(order.pod, ReclaimStep.DEADLINE_PASSED)
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
        return len(signalled), len(killed), self._clock() - began, suspended
