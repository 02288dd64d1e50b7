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
    pod that asked for no GPU in an infrastructure namespace (``--infrastructure-namespaces``)."""
    undecided: bool = False
    """Set for a holder recorded as undecided (:attr:`Holder.undecided`), so that whoever judges
    holders by their identity (the lending rules) leaves it alone; the resolver never sets it."""


@dataclass(frozen=True)
class Holder:
    """A process holding a device file open, and the container it runs in when known.

    ``start_time`` (clock ticks since boot, /proc/<pid>/stat) tells a live holder from a process
    that got its PID reused. Empty ``container``/``pod``/``namespace`` mean not in a known pod.
    ``priority`` is filled by the lending rules; ``None`` until they exist. ``infrastructure``: set
    when the holder keeps the device open without working on it: the executable's name of a host
    daemon (nvidia-persistenced, DCGM), or the namespace of a GPU-infrastructure pod that asked for
    no GPU (the GPU Operator's DCGM exporter): it is recorded and shown, but it neither makes the card
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
    undecided: bool = False
    """A process of a pod recorded while the agent's pod watch had not listed the node's pods yet, on
    a node where some pods may be infrastructure (``--infrastructure-namespaces``): whether it is
    infrastructure or a tenant's is not known, so it neither makes the card held nor is judged (no
    risk finding, no lending owner, bar or reclaim victim), and no new loan is made of a card it
    holds, until the first list is in or the wait for it ends (docs/monitor.md, "Before the pod watch has
    listed")."""


def counts_as_use(holder: Holder) -> bool:
    """Whether a holder makes its card held: one that is neither infrastructure nor undecided."""
    return not holder.infrastructure and not holder.undecided


@dataclass(frozen=True)
class DeviceUsage:
    """One device file: its holders (ordered by pid), the last open or close, and its state."""

    path: str
    holders: tuple[Holder, ...] = ()
    last_use: float | None = None
    state: DeviceState = DeviceState.FREE

    @property
    def users(self) -> tuple[Holder, ...]:
        """The holders that make the card held: neither infrastructure nor undecided."""
        return tuple(h for h in self.holders if counts_as_use(h))

    def holder(self, pid: int) -> Holder | None:
        """The holder with this pid, if any."""
        for holder in self.holders:
            if holder.pid == pid:
                return holder
        return None

    def with_holders(self, holders: tuple[Holder, ...], last_use: float | None) -> DeviceUsage:
        """A copy with these holders; a device no user holds is free (infrastructure and undecided
        holders alone leave it free), a newly used one busy."""
        ordered = tuple(sorted(holders, key=lambda h: h.pid))
        users = [h for h in ordered if counts_as_use(h)]
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
