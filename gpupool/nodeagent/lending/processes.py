"""The processes of a pod's containers, found through /proc the way the usage monitor names holders.

Reclaiming a container means ending every process in it, not only the one that holds the card (a
training job's data loaders, a shell around the program). The monitor's PID → container mapping
reads ``/proc/<pid>/cgroup``; here the same reading runs over every process and keeps those whose
container ID (or pod UID, where the cgroup path has one) belongs to the pod being reclaimed. A port
so that the reclaim's timing is tested with scripted processes as well as real ones.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from gpupool.nodeagent.containers.cgroup_identity import identity_from_cgroup_file
from gpupool.nodeagent.linux.procfs import PROC, all_pids


@dataclass(frozen=True)
class PodProcesses:
    """What identifies a pod's processes: its UID and its containers' runtime IDs."""

    uid: str
    container_ids: frozenset[str]
    inits_only: bool = False
    """The checkpoint signal goes to each container's process 1 only (a pod whose containers run under
    ``criu-run``, which dumps the rest with CRIU): signalled too, the workload's own processes would
    end, or write their own checkpoint, before the dump. The deadline and the kill cover them all."""


class ProcessControl(Protocol):
    """Finding and signalling the processes of a pod."""

    def pids(self, target: PodProcesses) -> set[int]:
        """Live processes of the pod now (zombies excluded: they hold nothing)."""
        ...

    def send(self, pid: int, sig: signal.Signals) -> None:
        """Signal one process; a process that is already gone is not an error."""
        ...

    def inits(self, pids: set[int]) -> set[int]:
        """Those of ``pids`` that are process 1 of their pid namespace (a container's first process)."""
        ...


class ProcfsProcesses:
    """:class:`ProcessControl` over /proc and ``kill(2)`` (the agent runs with ``hostPID``)."""

    def __init__(self, proc: str = PROC, skip: Iterable[int] | None = None) -> None:
        self._proc = proc
        self._skip = frozenset(skip) if skip is not None else frozenset({os.getpid()})

    def pids(self, target: PodProcesses) -> set[int]:
        found = set()
        for pid in all_pids(self._proc):
            if pid in self._skip:
                continue
            try:
                with open(f"{self._proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
                    who = identity_from_cgroup_file(fh.read())
            except OSError:
                continue
            if ((who.container_id and who.container_id in target.container_ids)
                    or (who.pod_uid and who.pod_uid == target.uid)) and not _zombie(self._proc, pid):
                found.add(pid)
        return found

    def send(self, pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    def inits(self, pids: set[int]) -> set[int]:
        return {pid for pid in pids if namespace_pid(self._proc, pid) == 1}


def namespace_pid(proc: str, pid: int) -> int | None:
    """``pid``'s id in its own (innermost) pid namespace: the last ``NSpid`` field of its status."""
    try:
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    fields = line.split()
                    return int(fields[-1]) if len(fields) > 1 else None
    except (OSError, ValueError):
        return None
    return None


def _zombie(proc: str, pid: int) -> bool:
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2:][:1] in ("Z", "X")
