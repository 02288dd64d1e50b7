"""Refuse a container's opens of GPU device files, for several deciders at once (the lending rules,
the risk checks), through the cgroup-device gate.

The kernel's answer at open has to be in place before the open (a cgroup-device program cannot ask
user space), so each decider states *which containers may not open which device files now*; this
class keeps the union of those statements in :class:`~gpupool.nodeagent.linux.cgroup_device_gate.CgroupDeviceGate`: a
(container, file) pair enters the kernel's deny map when the first decider wants it and leaves it
when the last one stops wanting it. Containers are named by runtime ID (what the pods' statuses and
the monitor's holders carry); a container's cgroup2 directory is found once, from any of its
processes, and kept until nothing of it is refused any more.

A container with no process yet (its ID is known, its process not started) cannot be refused: it
is tried again at the next :meth:`ContainerGate.set` (the lending step calls it every second).
A failing gate call is logged and tried again in the same way; it never raises to the decider.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpupool.nodeagent.containers.cgroup_identity import identity_from_cgroup_file
from gpupool.nodeagent.linux.cgroup2 import Cgroup2Error, cgroup2_path_of_pid
from gpupool.nodeagent.linux.cgroup_device_gate import GateError
from gpupool.nodeagent.linux.procfs import PROC, all_pids

log = logging.getLogger(__name__)

Refusals = Mapping[str, Iterable[str]]
"""Container runtime ID → the device files its processes may not open."""


class DeviceGate(Protocol):
    """What this class needs of :class:`~gpupool.nodeagent.linux.cgroup_device_gate.CgroupDeviceGate`."""

    def deny(self, cgroup: str, device: str) -> None: ...

    def allow(self, cgroup: str, device: str) -> None: ...

    def close(self) -> None: ...


def find_container_cgroup(container_id: str, proc: str = PROC) -> str | None:
    """The cgroup2 path (``/proc/<pid>/cgroup``'s ``0::`` line) of a process of the container with
    this runtime ID; ``None`` when no process of it runs now."""
    for pid in all_pids(proc):
        try:
            with open(f"{proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        if identity_from_cgroup_file(text).container_id != container_id:
            continue
        try:
            return cgroup2_path_of_pid(pid, proc)
        except Cgroup2Error:
            return None
    return None


@dataclass
class GateStats:
    """What the gate did (for logs, metrics and the benchmark)."""

    denied: int = 0
    allowed: int = 0
    failures: int = 0
    last_deny_s: float = 0.0
    """Seconds the last deny took from the decider's statement to the kernel's map holding it."""
    deny_seconds: list[float] = field(default_factory=list)
    """The last 100 of those."""


class ContainerGate:
    """The union of the deciders' refusals, applied to the kernel per container (thread-safe)."""

    def __init__(self, gate: DeviceGate, find_cgroup: Callable[[str], str | None] = find_container_cgroup) -> None:
        self._gate = gate
        self._find = find_cgroup
        self._lock = threading.Lock()
        self._wanted: dict[str, dict[str, frozenset[str]]] = {}
        self._applied: set[tuple[str, str]] = set()
        self._cgroups: dict[str, str] = {}
        self.stats = GateStats()

    def set(self, decider: str, refusals: Refusals) -> None:
        """``decider``'s refusals now (replacing its previous ones); applied before returning, as far
        as the containers' processes can be found."""
        began = time.monotonic()
        with self._lock:
            self._wanted[decider] = {cid: frozenset(paths) for cid, paths in refusals.items() if cid and paths}
            self._sync(began)

    def refused(self) -> dict[str, frozenset[str]]:
        """Container ID → the device files the kernel refuses it now."""
        with self._lock:
            out: dict[str, set[str]] = {}
            for cid, path in self._applied:
                out.setdefault(cid, set()).add(path)
            return {cid: frozenset(paths) for cid, paths in out.items()}

    def close(self) -> None:
        """Allow everything again and detach (agent exit)."""
        with self._lock:
            self._wanted.clear()
            self._applied.clear()
            self._gate.close()

    def _sync(self, began: float) -> None:
        union = {(cid, path) for wanted in self._wanted.values() for cid, paths in wanted.items() for path in paths}
        for cid, path in sorted(self._applied - union):
            try:
                self._gate.allow(self._cgroups[cid], path)
            except GateError as exc:
                self.stats.failures += 1
                log.warning("device gate: cannot allow %s again to container %s: %s", path, cid[:12], exc)
            self._applied.discard((cid, path))
            self.stats.allowed += 1
        for cid, path in sorted(union - self._applied):
            cgroup = self._cgroups.get(cid) or self._find(cid)
            if cgroup is None:
                continue  # no process yet: the next set tries again
            self._cgroups[cid] = cgroup
            try:
                self._gate.deny(cgroup, path)
            except GateError as exc:
                self.stats.failures += 1
                self._cgroups.pop(cid, None)  # a restarted container has a new cgroup
                log.warning("device gate: cannot refuse %s to container %s: %s", path, cid[:12], exc)
                continue
            self._applied.add((cid, path))
            elapsed = time.monotonic() - began
            self.stats.denied += 1
            self.stats.last_deny_s = elapsed
            self.stats.deny_seconds = [*self.stats.deny_seconds[-99:], elapsed]
            log.info("device gate: container %s may not open %s (in place %.1f ms after the decision)",
                     cid[:12], path, elapsed * 1000)
        live = {cid for cid, _ in self._applied}
        self._cgroups = {cid: cg for cid, cg in self._cgroups.items() if cid in live}


def open_container_gate() -> tuple[ContainerGate | None, str]:
    """The gate over the kernel's cgroup-device programs, or ``None`` and why not."""
    from gpupool.nodeagent.linux.cgroup_device_gate import CgroupDeviceGate
    try:
        return ContainerGate(CgroupDeviceGate()), "cgroup-device BPF"
    except GateError as exc:
        return None, str(exc)
