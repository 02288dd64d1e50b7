"""Kernel-side events through fanotify: opens held until the decider answers, closes reported.

Each watched file is marked for ``FAN_OPEN_PERM`` (the kernel holds the opener until this source
writes ``FAN_ALLOW`` or ``FAN_DENY``), ``FAN_OPEN`` (the open succeeded: only then is it recorded)
and ``FAN_CLOSE_WRITE``/``FAN_CLOSE_NOWRITE`` (the last reference to an open file went away).
Opens by this process itself (the agent's own NVML calls) are allowed and not recorded: answering
its own permission event from the thread that waits for it would deadlock.

Marks are on inodes: a device node a container runtime creates anew in a container's /dev is a
different inode and is not seen (docs/monitor.md). The switch off flushes all marks, so opens then
proceed with no round trip to user space.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable

from gpupool.nodeagent.linux import fanotify_abi as abi
from gpupool.nodeagent.linux.watched_files import WatchedFiles
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind, SourceBase, Verdict

log = logging.getLogger(__name__)

MARK_MASK = abi.FAN_OPEN_PERM | abi.FAN_OPEN | abi.CLOSE_MASK
STOP_JOIN_SECONDS = 5.0


class FanotifySource(SourceBase):
    """Reports opens and closes of ``paths`` and answers permission events with the decider."""

    def __init__(self, paths: Iterable[str], *, clock: Callable[[], float] = time.time,
                 ignore_pids: Iterable[int] | None = None) -> None:
        super().__init__()
        self._files = WatchedFiles(paths)
        self._clock = clock
        self._ignore = frozenset(ignore_pids) if ignore_pids is not None else frozenset({os.getpid()})
        self._api = abi.Fanotify()
        self._group = -1
        self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None
        self.marked: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """``fanotify``."""
        return "fanotify"

    @property
    def can_decide(self) -> bool:
        """Opens wait for the decider."""
        return True

    def start(self) -> None:
        """Create the group, mark the files (when watching) and start the reader thread."""
        self._require_registration()
        if self._thread is not None:
            return
        self._group = self._api.init(abi.FAN_CLASS_CONTENT)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        if self._watching:
            self._mark_all()
        self._thread = threading.Thread(target=self._run, name="gpupool-fanotify", daemon=True)
        self._thread.start()

    def set_watching(self, on: bool) -> None:
        """Mark the files again (on) or flush every mark (off)."""
        if on == self._watching:
            return
        self._watching = on
        if self._group < 0:
            return
        if on:
            self._mark_all()
        else:
            self._api.mark(self._group, abi.FAN_MARK_FLUSH, 0, None)
            self.marked = ()

    def stop(self) -> None:
        """Stop the reader and close the group (the kernel then allows any open still waiting)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            os.write(self._wake_w, b"x")
            thread.join(STOP_JOIN_SECONDS)
        for fd in (self._group, self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._group = self._wake_r = self._wake_w = -1

    def _mark_all(self) -> None:
        self._files.refresh()
        marked: list[str] = []
        for path in self._files.paths:
            try:
                self._api.mark(self._group, abi.FAN_MARK_ADD, MARK_MASK, path)
                marked.append(path)
            except abi.FanotifyError as exc:
                log.warning("not watching %s: %s", path, exc)
        self.marked = tuple(marked)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._group, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_r in ready:
                return
            try:
                buffer = os.read(self._group, abi.READ_BUFFER_BYTES)
            except BlockingIOError:
                continue
            except OSError:
                log.exception("reading the fanotify group failed; the source stops")
                return
            try:
                events = abi.parse_events(buffer)
            except ValueError:
                log.exception("dropping an unreadable fanotify buffer of %d bytes", len(buffer))
                continue
            for raw in events:
                self._handle(raw)

    def _handle(self, raw: abi.RawEvent) -> None:
        if raw.mask & abi.FAN_Q_OVERFLOW:
            log.warning("fanotify queue overflowed: some opens and closes were not seen")
            return
        waiting = bool(raw.mask & abi.FAN_OPEN_PERM)  # the opener is blocked until answered
        try:
            path = self._files.path_of_fd(raw.fd) or os.readlink(f"/proc/self/fd/{raw.fd}")
            own = raw.pid in self._ignore
            now = self._clock()
            if waiting:
                verdict = Verdict.ALLOW if own else self._decide(DeviceEvent(EventKind.OPEN, path, raw.pid, now))
                waiting = False
                self._answer(raw.fd, verdict)
            if own:
                return
            if raw.mask & abi.FAN_OPEN:
                self._deliver(DeviceEvent(EventKind.OPEN, path, raw.pid, now))
            if raw.mask & abi.CLOSE_MASK:
                self._deliver(DeviceEvent(EventKind.CLOSE, path, raw.pid, now))
        except OSError:
            log.exception("handling fanotify event %#x of pid %d failed", raw.mask, raw.pid)
        finally:
            if waiting:
                self._answer(raw.fd, Verdict.ALLOW)
            os.close(raw.fd)

    def _answer(self, fd: int, verdict: Verdict) -> None:
        try:
            os.write(self._group, abi.encode_response(fd, verdict is Verdict.ALLOW))
        except OSError:
            log.exception("answering a fanotify permission event failed")
