"""The first life of a node agent killed mid-reclaim (issue 28): run as its own process, it lends
card 0, sees the owner open it again, starts reclaiming the borrower (real processes) and SIGKILLs
itself right after the reclaim journal records the step named on its command line.

``python3 -m tests.nodeagent.lending.restart_driver <dir> <step> <pid>...``; ``<step>`` is a
:class:`ReclaimStep` label or ``done`` (the record removed). Exit status 3: the step never came.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpupool.nodeagent.lending.processes import PodProcesses
from gpupool.nodeagent.lending.reclaim_journal import ReclaimJournal, ReclaimStep
from gpupool.nodeagent.monitor.usage_state import DeviceState
from tests.nodeagent.lending.support import holder
from tests.nodeagent.lending.world import CARD0, PODS, World, idle_owner, open_

DONE = "done"
STEPS = (*(s.label for s in ReclaimStep), DONE)
BORROWER_ID = "id-borrower"


class PidProcesses:
    """:class:`ProcessControl` over real processes known by pid (all of them the borrower's)."""

    def __init__(self, pids: Iterable[int], container_id: str = BORROWER_ID) -> None:
        self.members = {pid: container_id for pid in pids}
        self.sent: list[tuple[int, str]] = []

    def pids(self, target: PodProcesses) -> set[int]:
        return {p for p, c in self.members.items() if c in target.container_ids and alive(p)}

    def send(self, pid: int, sig: signal.Signals) -> None:
        self.sent.append((pid, sig.name))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def alive(pid: int) -> bool:
    """Running (a zombie, waiting for its parent to reap it, holds nothing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def die_after(step: str) -> None:
    """SIGKILL this process right after the journal has written ``step``."""
    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    begin, advance, finish = ReclaimJournal.begin, ReclaimJournal.advance, ReclaimJournal.finish

    def begin_then(self: ReclaimJournal, records: Any) -> None:
        begin(self, records)
        if step == ReclaimStep.RECORDED.label:
            die()

    def advance_then(self: ReclaimJournal, pod: Any, reached: ReclaimStep, signalled_at: float | None = None) -> None:
        advance(self, pod, reached, signalled_at)
        if reached.label == step:
            die()

    def finish_then(self: ReclaimJournal, pod: Any) -> Any:
        record = finish(self, pod)
        if step == DONE:
            die()
        return record

    ReclaimJournal.begin = begin_then  # type: ignore[method-assign]
    ReclaimJournal.advance = advance_then  # type: ignore[method-assign]
    ReclaimJournal.finish = finish_then  # type: ignore[method-assign]


async def first_life(directory: Path, pids: list[int]) -> None:
    world = World(directory, PODS)
    world.processes = PidProcesses(pids)  # type: ignore[assignment]
    service = world.started()
    idle_owner(world)
    await service.step()
    assert set(service.loans) == {0}
    world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
    service.decide(open_(101))  # the owner opens its card again: rule 1, the borrower is reclaimed
    await asyncio.sleep(30)


def main(argv: list[str]) -> int:
    directory, step, pids = Path(argv[0]), argv[1], [int(p) for p in argv[2:]]
    if step not in STEPS:
        raise SystemExit(f"step {step!r} is none of {STEPS}")
    die_after(step)
    asyncio.run(first_life(directory, pids))
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
