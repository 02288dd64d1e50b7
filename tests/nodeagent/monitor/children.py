"""Real child processes that open and close files on cue, and a sink that collects events."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time
from collections.abc import Callable

from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind

WAIT_SECONDS = 5.0

_HOLDER = (
    "import os, sys\n"
    "fds = [os.open(p, os.O_RDONLY) for p in sys.argv[1:]]\n"
    "print('opened', flush=True)\n"
    "sys.stdin.readline()\n"
    "for fd in fds: os.close(fd)\n"
    "print('closed', flush=True)\n"
    "sys.stdin.readline()\n"
)

_LATE_OPENER = (
    "import os, sys\n"
    "print('started', flush=True)\n"
    "sys.stdin.readline()\n"
    "fds = [os.open(p, os.O_RDONLY) for p in sys.argv[1:]]\n"
    "print('opened', flush=True)\n"
    "sys.stdin.readline()\n"
)

_TRY_OPEN = (
    "import os, sys\n"
    "try:\n"
    "    os.close(os.open(sys.argv[1], os.O_RDONLY))\n"
    "    print(0)\n"
    "except OSError as exc:\n"
    "    print(exc.errno)\n"
)


class HoldingChild:
    """A process that opens ``paths``, holds them until :meth:`close_files`, and exits on :meth:`end`."""

    def __init__(self, *paths: str, script: str = _HOLDER, first_word: str = "opened") -> None:
        self.process = subprocess.Popen([sys.executable, "-c", script, *paths], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.pid = self.process.pid
        self._expect(first_word)

    def _expect(self, word: str) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        assert line == word, f"child said {line!r}, expected {word!r}"

    def close_files(self) -> None:
        """Close every file; returns when the child has closed them."""
        self._cue("closed")

    def _cue(self, word: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        self._expect(word)

    def end(self) -> None:
        """Let the child exit and reap it."""
        if self.process.poll() is None:
            assert self.process.stdin is not None
            try:
                self.process.stdin.write("\n\n")
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        self.process.wait(WAIT_SECONDS)

    def __enter__(self) -> HoldingChild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()


class LateOpener(HoldingChild):
    """A process that starts holding nothing and opens ``paths`` on :meth:`open_files` (an old process
    that takes a GPU later)."""

    def __init__(self, *paths: str) -> None:
        super().__init__(*paths, script=_LATE_OPENER, first_word="started")

    def open_files(self) -> None:
        """Open every file; returns when the child holds them."""
        self._cue("opened")


def open_in_child(path: str) -> int:
    """Open and close ``path`` in a child process; the errno its open failed with, 0 on success."""
    out = subprocess.run([sys.executable, "-c", _TRY_OPEN, path], capture_output=True, text=True,
                         timeout=WAIT_SECONDS, check=True)
    return int(out.stdout.strip())


class CollectingSink:
    """Collects delivered events; :meth:`wait_for` blocks until a matching one arrives."""

    def __init__(self) -> None:
        self._queue: queue.Queue[DeviceEvent] = queue.Queue()
        self.seen: list[DeviceEvent] = []

    def __call__(self, event: DeviceEvent) -> None:
        self._queue.put(event)

    def wait_for(self, kind: EventKind, path: str, pid: int, timeout: float = WAIT_SECONDS) -> DeviceEvent:
        """The first event of this kind, path and pid (earlier others are kept in :attr:`seen`)."""
        return self.wait_until(lambda e: (e.kind, e.path, e.pid) == (kind, path, pid), timeout,
                               f"{kind} of {path} by {pid}")

    def wait_until(self, match: Callable[[DeviceEvent], bool], timeout: float, what: str) -> DeviceEvent:
        """The first event ``match`` accepts, or a failed assertion naming ``what`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        for event in self.seen:
            if match(event):
                return event
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self._queue.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(event)
            if match(event):
                return event
        raise AssertionError(f"no {what} within {timeout} s; saw {self.seen}")

    def drain(self, settle: float = 0.2) -> list[DeviceEvent]:
        """Everything delivered within ``settle`` seconds from now, added to :attr:`seen`."""
        time.sleep(settle)
        while True:
            try:
                self.seen.append(self._queue.get_nowait())
            except queue.Empty:
                return self.seen


def stand_in(directory: str, name: str) -> str:
    """A regular file standing in for a device node."""
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("stand-in for a GPU device node\n")
    return path
