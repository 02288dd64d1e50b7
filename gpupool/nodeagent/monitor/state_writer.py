"""Write-behind for the state file: the recorder hands over states, a thread writes the latest.

A write costs two fsyncs (milliseconds). Done on the event source's thread it would hold up the
answers to other processes' opens and fall behind under bursts; here a burst of events costs one
write of the newest state, and the time from an open to its record is at most about two writes.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Protocol

from gpupool.nodeagent.monitor.state_file import StateFile
from gpupool.nodeagent.monitor.usage_state import UsageState

log = logging.getLogger(__name__)

STOP_JOIN_SECONDS = 5.0


class StateStore(Protocol):
    """Where the recorder keeps its state: :class:`StateFile` or :class:`BackgroundStateWriter`."""

    @property
    def path(self) -> Path:
        """The file's path (for logs)."""
        ...

    def write(self, state: UsageState) -> None:
        """Store ``state`` (now, or soon); may raise ``OSError`` when done now."""
        ...

    def load(self) -> UsageState | None:
        """The stored state, ``None`` when there is none usable."""
        ...


class BackgroundStateWriter:
    """A :class:`StateStore` whose writes happen on its own thread, newest state first and only."""

    def __init__(self, file: StateFile) -> None:
        self._file = file
        self._pending: UsageState | None = None
        self._writing = False
        self._changed = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def path(self) -> Path:
        """The file's path."""
        return self._file.path

    def load(self) -> UsageState | None:
        """Read the file (synchronously: only at start-up)."""
        return self._file.load()

    def start(self) -> None:
        """Start the writing thread."""
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="gpupool-state-writer", daemon=True)
            self._thread.start()

    def write(self, state: UsageState) -> None:
        """Queue ``state``; it replaces any state not yet written."""
        with self._changed:
            self._pending = state
            self._changed.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued is on disk; ``False`` on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._pending is None and not self._writing, timeout)

    def stop(self) -> None:
        """Write what is queued and stop the thread."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        thread.join(STOP_JOIN_SECONDS)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending is not None or self._stopping)
                state, self._pending = self._pending, None
                if state is None:
                    return
                self._writing = True
            try:
                self._file.write(state)
            except OSError as exc:
                log.error("cannot write the usage state file %s (%s); retried with the next change",
                          self._file.path, exc.strerror)
            finally:
                with self._changed:
                    self._writing = False
                    self._changed.notify_all()
