"""What concurrent prepares and unprepares write to disk, written together in one worker-thread call.

kubelet sends one NodePrepareResources per pod, so 100 pods starting at once are 100 calls, each
with one CDI spec to write and a checkpoint to wait for. Handing each spec to a thread of its own
(``asyncio.to_thread``), then the checkpoint to another, cost over 100 thread hand-offs whose
wake-ups and GIL switches the event loop shared while it still had calls to receive and book. Here
a call adds its specs to the pending batch and waits; one writer takes the whole batch to a thread,
writes every spec, then the checkpoint (once for all: the claims as they are when the batch starts,
less those whose spec failed), and wakes each call with its own outcome. What arrives while a batch
is written makes up the next, so 100 concurrent calls cost a few thread hand-offs, not 200. Calls do
not arrive at once, though: the plugin's one event loop receives them one after another while it
books the ones before (100 took 30-60 ms on the shared 2-core test machine), so a writer that took
whatever had arrived made 10-30 small batches, each a checkpoint write and a thread hand-off that
competed with the loop still receiving. The writer therefore waits while calls keep arriving
(:data:`SETTLE_PAUSE_S` at a time, at most :data:`SETTLE_MOST_S`): 100 calls make 2-3 batches, and
a lone call waits one pause. A spec that cannot be written fails only its own claim; a checkpoint
that cannot be written fails every call that waited for it (kubelet calls again, and the retry
writes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpupool.nodeagent.dra import checkpoint
from gpupool.nodeagent.dra.cdi import CdiSpecs
from gpupool.nodeagent.dra.checkpoint import PreparedClaim
from gpupool.nodeagent.types import ContainerGrant

Snapshot = Callable[[], tuple[int, Mapping[str, PreparedClaim]]]
"""(version, UID → prepared claim) now: what the checkpoint must hold, and the change count it is at."""


SETTLE_PAUSE_S = 0.001
"""How long the writer waits for one more caller before it takes a batch."""
SETTLE_MOST_S = 0.02
"""The longest it waits while callers keep arriving: a steady stream is still written."""


class CheckpointNotWritten(Exception):
    """The checkpoint a call waited for could not be written; ``outcomes`` are its specs' (each
    error or ``None``), so that the caller still forgets the claims whose spec failed."""

    def __init__(self, error: Exception, outcomes: list[Exception | None]) -> None:
        super().__init__(str(error))
        self.error = error
        self.outcomes = outcomes


@dataclass
class _Waiter:
    specs: Sequence[tuple[str, ContainerGrant]]
    version: int
    """The checkpoint must be at this version or later before the call answers."""
    done: asyncio.Future[list[Exception | None]]


class ClaimWriter:
    """Writes CDI specs with ``cdi()`` and the checkpoint at ``path`` of :meth:`write`'s callers."""

    def __init__(self, cdi: Callable[[], CdiSpecs], path: str, snapshot: Snapshot) -> None:
        self._cdi = cdi
        """The specs to write with, read at each batch (a test may replace the state's ``cdi``)."""
        self._path = path
        self._snapshot = snapshot
        self._saved = 0
        """The version the checkpoint file holds (0: as loaded at start)."""
        self._lines = checkpoint.KeptLines()
        """The claims' lines of the file, encoded once each (used only by the one thread call at a time)."""
        self._pending: list[_Waiter] = []
        self._writer: asyncio.Task[None] | None = None
        self.batches = 0
        """Thread calls made so far (the tests count them)."""

    async def write(self, specs: Sequence[tuple[str, ContainerGrant]], version: int) -> list[Exception | None]:
        """Write ``specs`` (claim UID, grant) with the others waiting, and the checkpoint at
        ``version`` or later; each spec's error or ``None``, once the checkpoint holds every claim
        whose spec was written. Raises :class:`CheckpointNotWritten` when the checkpoint could not
        be written."""
        if not specs and self._saved >= version:
            return []
        done: asyncio.Future[list[Exception | None]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Waiter(specs, version, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain())
        return await done

    async def _settle(self) -> None:
        """Wait while callers are still arriving before a batch is taken: a pause of
        ``SETTLE_PAUSE_S`` at a time, while each adds callers, at most ``SETTLE_MOST_S`` in all."""
        loop = asyncio.get_running_loop()
        until = loop.time() + SETTLE_MOST_S
        while True:
            waiting = len(self._pending)
            await asyncio.sleep(SETTLE_PAUSE_S)
            if len(self._pending) == waiting or loop.time() >= until:
                return

    async def _drain(self) -> None:
        """Write batches until none is pending (what arrives meanwhile forms the next one)."""
        while self._pending:
            try:
                await self._settle()
            except asyncio.CancelledError:  # the loop is shutting down: so are the callers
                for waiter in self._pending:
                    waiter.done.cancel()
                raise
            batch, self._pending = self._pending, []
            self.batches += 1
            version, claims = self._snapshot()
            specs = [spec for waiter in batch for spec in waiter.specs]
            try:
                outcomes, saved = await asyncio.to_thread(_write_all, self._cdi(), specs, self._path, dict(claims),
                                                          self._saved < version, self._lines)
            except asyncio.CancelledError:  # the loop is shutting down: so are the callers
                for waiter in batch + self._pending:
                    waiter.done.cancel()
                raise
            except Exception as exc:  # the hand-off itself failed: every caller learns why
                outcomes, saved = [exc] * len(specs), exc
            if saved is None:
                self._saved = max(self._saved, version)
            at = 0
            for waiter in batch:
                mine, at = outcomes[at:at + len(waiter.specs)], at + len(waiter.specs)
                if waiter.done.done():  # its caller was cancelled
                    continue
                if saved is not None and waiter.version > self._saved:
                    waiter.done.set_exception(CheckpointNotWritten(saved, mine))
                else:
                    waiter.done.set_result(mine)


def _write_all(cdi: CdiSpecs, specs: list[tuple[str, ContainerGrant]], path: str,
               claims: dict[str, PreparedClaim], save: bool,
               lines: checkpoint.KeptLines | None = None) -> tuple[list[Exception | None], Exception | None]:
    """In a worker thread: write each spec in order, then (when ``save``, or when a claim it holds
    failed its spec) the checkpoint of ``claims`` less the claims whose spec failed, re-encoding
    only the claims ``lines`` does not hold yet; each spec's error or ``None``, and the checkpoint's."""
    outcomes: list[Exception | None] = []
    kept = len(claims)
    for claim_uid, grant in specs:
        try:
            cdi.write(claim_uid, grant)
        except Exception as exc:  # one claim's spec: its call fails, the others go on
            outcomes.append(exc)
            claims.pop(claim_uid, None)
        else:
            outcomes.append(None)
    if not save and len(claims) == kept:  # a failed spec of a claim held before: the file must drop it
        return outcomes, None
    try:
        checkpoint.save(path, claims, lines)
    except Exception as exc:  # the callers waiting for it fail; kubelet calls again
        return outcomes, exc
    return outcomes, None
