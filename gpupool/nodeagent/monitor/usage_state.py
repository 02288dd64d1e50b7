"""The recorded usage of a node's GPU device files: who holds each, since when, and its state.

This is what the state file stores. Only the node agent writes and reads it (the lending rules and
the risk checks run inside the agent), so the schema lives with the monitor, not in ``gpupool.api``;
it is versioned all the same because the file outlives the agent that wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class DeviceState(StrEnum):
    """free: nobody holds it; busy: held and in use; idle: held but unused for the idle time."""

    FREE = "free"
    BUSY = "busy"
    IDLE = "idle"


@dataclass(frozen=True)
class ProcessIdentity:
    """The container a process runs in; empty fields when it runs in none the node knows."""

    container_id: str = ""
    container: str = ""
    pod: str = ""
    namespace: str = ""
    infrastructure: str = ""
    """Why the process is an infrastructure holder, else empty: the executable's name of a host daemon
    (``--infrastructure-holders``: in no container, matched by /proc/<pid>/exe), or the namespace of a
    pod that booked no GPU in an infrastructure namespace (``--infrastructure-namespaces``)."""


@dataclass(frozen=True)
class Holder:
    """A process holding a device file open, and the container it runs in when known.

    ``start_time`` (clock ticks since boot, /proc/<pid>/stat) tells a live holder from a process
    that got its PID reused. Empty ``container``/``pod``/``namespace`` mean not in a known pod.
    ``priority`` is filled by the lending rules; ``None`` until they exist. ``infrastructure``: set
    when the holder keeps the device open without working on it: the executable's name of a host
    daemon (nvidia-persistenced, DCGM), or the namespace of a GPU-infrastructure pod that booked no
    GPU (the GPU Operator's DCGM exporter): it is recorded and shown, but it neither makes the card
    busy nor blocks lending (docs/monitor.md, "Infrastructure holders").
    """

    pid: int
    start_time: int
    since: float
    container_id: str = ""
    container: str = ""
    pod: str = ""
    namespace: str = ""
    priority: int | None = None
    infrastructure: str = ""


@dataclass(frozen=True)
class DeviceUsage:
    """One device file: its holders (ordered by pid), the last open or close, and its state."""

    path: str
    holders: tuple[Holder, ...] = ()
    last_use: float | None = None
    state: DeviceState = DeviceState.FREE

    @property
    def users(self) -> tuple[Holder, ...]:
        """The holders that are not infrastructure: the ones that make the card held."""
        return tuple(h for h in self.holders if not h.infrastructure)

    def holder(self, pid: int) -> Holder | None:
        """The holder with this pid, if any."""
        for holder in self.holders:
            if holder.pid == pid:
                return holder
        return None

    def with_holders(self, holders: tuple[Holder, ...], last_use: float | None) -> DeviceUsage:
        """A copy with these holders; a device no user holds is free (infrastructure holders alone
        leave it free), a newly used one busy."""
        ordered = tuple(sorted(holders, key=lambda h: h.pid))
        users = [h for h in ordered if not h.infrastructure]
        if not users:
            state = DeviceState.FREE
        elif self.state is DeviceState.FREE or len(users) > len(self.users):
            state = DeviceState.BUSY
        else:
            state = self.state
        return replace(self, holders=ordered, last_use=last_use, state=state)


@dataclass(frozen=True)
class UsageState:
    """All watched device files of one node, ordered by path."""

    node: str
    updated: float
    devices: tuple[DeviceUsage, ...]

    def device(self, path: str) -> DeviceUsage | None:
        """The usage of one device file, if it is watched."""
        for device in self.devices:
            if device.path == path:
                return device
        return None
