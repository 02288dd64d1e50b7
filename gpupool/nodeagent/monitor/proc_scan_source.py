"""The portable event source: scan every process's open files for the watched device files.

Works on any Linux with /proc (no capability beyond reading other processes' fd tables), at the
price of latency (one interval) and of the allow/deny answer: it only sees opens that already
happened. Opens and closes are derived by diffing two scans; a process is (pid, start time), so a
reused PID shows as a close of the old process and an open of the new one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable

from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind, SourceBase
from gpupool.nodeagent.monitor.procfs import PROC, all_pids, held_files, process_start_time
from gpupool.nodeagent.monitor.watched_files import WatchedFiles

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_SECONDS = 1.0
STOP_JOIN_SECONDS = 5.0

_Holding = tuple[int, int, str]  # pid, start time, path


class ProcScanSource(SourceBase):
    """Reports opens and closes of ``paths`` found by scanning ``/proc/<pid>/fd`` every interval."""

    def __init__(self, paths: Iterable[str], *, interval: float = DEFAULT_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.time, ignore_pids: Iterable[int] | None = None,
                 proc: str = PROC) -> None:
        super().__init__()
        if interval <= 0:
            raise ValueError(f"scan interval must be positive, got {interval}")
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
        now_held: set[_Holding] = set()
        for pid in all_pids(self._proc):
            if pid in self._ignore:
                continue
            paths = held_files(pid, self._files, self._proc)
            if not paths:
                continue
            start = process_start_time(pid, self._proc)
            if start is None:
                continue  # exited between the two reads
            now_held.update((pid, start, path) for path in paths)
        now = self._clock()
        for pid, _start, path in sorted(self._held - now_held):
            self._deliver(DeviceEvent(EventKind.CLOSE, path, pid, now))
        for pid, _start, path in sorted(now_held - self._held):
            self._deliver(DeviceEvent(EventKind.OPEN, path, pid, now))
        self._held = now_held

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._watching:
                try:
                    self.scan_once()
                except Exception:
                    log.exception("scanning /proc for device holders failed; retrying next interval")
            self._stop.wait(self._interval)
