"""The portable event source: scan the processes' open files for the watched device files.

Works on any Linux with /proc (no capability beyond reading other processes' fd tables), at the
price of latency and of the allow/deny answer: it only sees opens that already happened. Opens and
closes are derived by diffing two scans; a process is (pid, start time), so a reused PID shows as a
close of the old process and an open of the new one.

Why not list every fd table every interval: the listing is the cost (a directory read and a
``readlink`` per descriptor, for every process of the host), several percent of a core with a few
hundred GPU processes. Each scan therefore lists fully only the processes that may have changed in a
way that matters soon:

- a process seen for the first time, and during its first :data:`YOUNG_SCANS` scans (a GPU program
  opens its devices while it starts: CUDA's initialisation a few seconds after ``exec``);
- a known holder whose start time changed (a reused PID) or one of whose held descriptors no longer
  links where it did: checked every scan with one ``stat`` read and one ``readlink`` per held
  descriptor, so closes and exits are reported within one interval;
- every other process once every :data:`FULL_LIST_EVERY` scans (staggered by PID): an old process
  that opens a device later, or a holder opening a further one, is reported within that many
  intervals.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpupool.nodeagent.linux.procfs import (
    PROC,
    HeldDescriptor,
    all_pids,
    held_descriptors,
    process_start_time,
    still_held,
)
from gpupool.nodeagent.linux.watched_files import WatchedFiles
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind, SourceBase

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_SECONDS = 1.0
STOP_JOIN_SECONDS = 5.0
FULL_LIST_EVERY = 5
"""A process's fd table is listed in full at least once in this many scans."""
YOUNG_SCANS = 30
"""Scans during which a newly seen process is listed in full every time (its start-up)."""

_Holding = tuple[int, int, str]  # pid, start time, path


@dataclass(frozen=True)
class _Seen:
    """What the last full listing of one process found. ``start`` is None for a non-holder (not read)."""

    start: int | None
    held: tuple[HeldDescriptor, ...]
    first_scan: int


class ProcScanSource(SourceBase):
    """Reports opens and closes of ``paths`` found by scanning ``/proc/<pid>/fd`` every interval."""

    def __init__(self, paths: Iterable[str], *, interval: float = DEFAULT_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.time, ignore_pids: Iterable[int] | None = None,
                 proc: str = PROC, full_list_every: int = FULL_LIST_EVERY, young_scans: int = YOUNG_SCANS) -> None:
        super().__init__()
        if interval <= 0:
            raise ValueError(f"scan interval must be positive, got {interval}")
        if full_list_every < 1 or young_scans < 0:
            raise ValueError(f"full_list_every must be >= 1 and young_scans >= 0, got {full_list_every}, "
                             f"{young_scans}")
        self._full_every = full_list_every
        self._young = young_scans
        self._scans = 0
        self._seen: dict[int, _Seen] = {}
        self._files = WatchedFiles(paths)
        self._interval = interval
        self._clock = clock
        self._ignore = frozenset(ignore_pids) if ignore_pids is not None else frozenset({os.getpid()})
        self._proc = proc
        self._held: set[_Holding] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        """``proc-scan``."""
        return "proc-scan"

    @property
    def can_decide(self) -> bool:
        """Opens are only observed after the fact."""
        return False

    def start(self) -> None:
        """Start the scanning thread (its first scan reports what is held already)."""
        self._require_registration()
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpupool-proc-scan", daemon=True)
        self._thread.start()

    def set_watching(self, on: bool) -> None:
        """Off pauses scanning; on resumes it (the next scan reports what changed meanwhile)."""
        self._watching = on

    def stop(self) -> None:
        """Stop the scanning thread; idempotent."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(STOP_JOIN_SECONDS)

    def scan_once(self) -> None:
        """One scan and the events of its difference to the previous one."""
        if self._files.missing:
            self._files.refresh()
            self._seen.clear()  # identities changed: list everything again
        scan, self._scans = self._scans, self._scans + 1
        seen: dict[int, _Seen] = {}
        for pid in all_pids(self._proc):
            if pid in self._ignore:
                continue
            found = self._look(pid, scan, self._seen.get(pid))
            if found is not None:
                seen[pid] = found
        self._seen = seen
        now_held = {(pid, s.start, h.path) for pid, s in seen.items() if s.start is not None for h in s.held}
        now = self._clock()
        for pid, _start, path in sorted(self._held - now_held):
            self._deliver(DeviceEvent(EventKind.CLOSE, path, pid, now))
        for pid, _start, path in sorted(now_held - self._held):
            self._deliver(DeviceEvent(EventKind.OPEN, path, pid, now))
        self._held = now_held

    def _look(self, pid: int, scan: int, before: _Seen | None) -> _Seen | None:
        """What ``pid`` holds now, listing its fd table only when it is due (module docstring); None:
        the process is gone."""
        first = scan if before is None else before.first_scan
        due = before is None or scan - first < self._young or (pid + scan) % self._full_every == 0
        if not due and before is not None and before.held:
            start = process_start_time(pid, self._proc)
            if start is None:
                return None
            if start == before.start and still_held(pid, before.held, self._proc):
                return before
        elif not due:
            return before  # a non-holder between its full listings
        held = held_descriptors(pid, self._files, self._proc)
        if not held:
            return _Seen(None, (), first)
        start = process_start_time(pid, self._proc)
        return None if start is None else _Seen(start, held, first)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._watching:
                try:
                    self.scan_once()
                except Exception:
                    log.exception("scanning /proc for device holders failed; retrying next interval")
            self._stop.wait(self._interval)
