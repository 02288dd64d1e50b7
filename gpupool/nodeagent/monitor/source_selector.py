"""Pick the event source that works on this kernel for these device files, and say why.

fanotify is preferred (it answers opens, and reports them as they happen) but a kernel may accept a
mark and still report nothing: kernels from 6.14 on (``file_set_fsnotify_mode``) send no fanotify
events for character devices, observed on 6.18. So the probe does what the source will rely on: it
marks each file for ``FAN_OPEN`` in a permission-class group, opens it, and waits for the event.
Anything short of an event for every file falls back to the /proc scan.

Apart from the event source, the start-up report says whether the cgroup-device gate
(``cgroup_device_gate``) can refuse a container's opens on this node: on kernels where fanotify is
blind to character devices it is the only allow/deny answer.
"""

from __future__ import annotations

import logging
import os
import select
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpupool.nodeagent.linux import fanotify_abi as abi
from gpupool.nodeagent.linux.cgroup_device_gate import cgroup_device_gate_available
from gpupool.nodeagent.linux.watched_files import FileKey
from gpupool.nodeagent.monitor.events import EventSource
from gpupool.nodeagent.monitor.fanotify_source import FanotifySource
from gpupool.nodeagent.monitor.proc_scan_source import DEFAULT_INTERVAL_SECONDS, ProcScanSource

log = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 0.5


@dataclass(frozen=True)
class SourceChoice:
    """The source to run and the reason it was chosen (logged at start, shown in docs)."""

    source: EventSource
    reason: str
    gate_available: bool = False
    """Whether ``CgroupDeviceGate`` works here (the allow/deny answer for device opens)."""
    gate_reason: str = "not probed"


def probe_fanotify(paths: Sequence[str], timeout: float = PROBE_TIMEOUT_SECONDS) -> str | None:
    """``None`` when fanotify reports an open of every path, else why not."""
    api = abi.Fanotify()
    try:
        group = api.init(abi.FAN_CLASS_CONTENT)
    except abi.FanotifyError as exc:
        return f"fanotify permission events unavailable ({exc.strerror}; needs CAP_SYS_ADMIN " \
               "and CONFIG_FANOTIFY_ACCESS_PERMISSIONS)"
    try:
        for path in paths:
            try:
                api.mark(group, abi.FAN_MARK_ADD, abi.FAN_OPEN, path)
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
            except OSError as exc:
                return f"cannot probe {path}: {exc.strerror}"
            if not _saw_open(group, FileKey.of(os.stat(path)), timeout):
                return f"the kernel accepts a fanotify mark on {path} but reports no open of it " \
                       f"(kernel {os.uname().release})"
        return None
    finally:
        os.close(group)


def _saw_open(group: int, key: FileKey, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([group], [], [], left)[0]:
            return False
        try:
            events = abi.parse_events(os.read(group, abi.READ_BUFFER_BYTES))
        except BlockingIOError:
            continue
        seen = False
        for event in events:
            if event.fd >= 0:
                seen = seen or FileKey.of(os.fstat(event.fd)) == key
                os.close(event.fd)
        if seen:
            return True
    return False


def choose_source(paths: Sequence[str], *, scan_interval: float = DEFAULT_INTERVAL_SECONDS,
                  probe: Callable[[Sequence[str]], str | None] = probe_fanotify,
                  gate_probe: Callable[[], tuple[bool, str]] = cgroup_device_gate_available) -> SourceChoice:
    """fanotify when the probe sees opens of every present path, else the /proc scan; and whether
    the cgroup-device gate runs."""
    present = [p for p in paths if os.path.exists(p)]
    if not present:
        why_not: str | None = "none of the watched device files exists yet"
    else:
        why_not = probe(present)
    gate_available, gate_reason = gate_probe()
    if why_not is None:
        choice = SourceChoice(FanotifySource(paths),
                              f"fanotify reports opens of {len(present)} device file(s); opens are "
                              "answered allow/deny", gate_available, gate_reason)
    else:
        choice = SourceChoice(ProcScanSource(paths, interval=scan_interval),
                              f"{why_not}: scanning /proc/<pid>/fd every {scan_interval:g} s "
                              "(no allow/deny)", gate_available, gate_reason)
    log.info("usage monitor event source: %s (%s)", choice.source.name, choice.reason)
    log.info("usage monitor device gate (deny opens per container): %s (%s)",
             "cgroup-device-bpf" if gate_available else "none", gate_reason)
    return choice
