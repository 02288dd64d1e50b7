"""The user-side recorder: turns open/close events into per-device holders in the state file.

It registers with an event source (:meth:`UsageRecorder.registration`), answers opens through the
decider it was given, and stores the state after every change (through a
:class:`~gpupool.nodeagent.monitor.state_writer.BackgroundStateWriter` in the agent, so that the
source's thread never waits for a disk). Events are facts about one
process and one file; the holder set is kept honest against /proc because events alone can mislead:
a close is reported for the process that dropped the *last* reference (after a fork, not the one
that opened), fanotify may merge events, and processes opened devices while the agent was down.
So a close removes every holder of that file that no longer holds it, a restart keeps only holders
whose process (pid and start time) is alive and still holds the file, and a scan adds holders
nobody saw open. A live holder is never dropped: the record errs towards busy, never towards free.

An infrastructure holder (a host daemon the resolver named so: nvidia-persistenced, DCGM; or a
process of a pod that asked for no GPU in an infrastructure namespace: the GPU Operator's DCGM
exporter) is recorded like any other, but its opens and closes are not use: they leave the device's
last use alone, and it alone does not make a device held (:attr:`DeviceUsage.users`). A pod's
process is judged by its pod, which the pod watch names only after the agent started. Until the
watch's first list is in (bounded: :mod:`~gpupool.nodeagent.monitor.pod_list_wait`, the recorder's
``undecided``), a pod's holder that could be infrastructure is recorded *undecided*: one whose pod
is not named yet (found at the restart's scan, or opening before the list), and one restored from
the file whose namespace is listed. It neither makes its card held nor is judged by anyone; its
opens count as use all the same (if it is a tenant's, its card's idle time must not have run on).
:meth:`UsageRecorder.identify_again` judges it once the list is in (or the wait ended). After the
list, a holder whose container is not named yet (a container that just started) counts as use until
it is, and a restored holder whose pod is not known keeps the previous agent's mark.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from gpupool.nodeagent.monitor.events import (
    DeviceEvent,
    EventKind,
    OpenDecider,
    Registration,
    Verdict,
    allow_every_open,
)
from gpupool.nodeagent.monitor.process_table import ProcessTable
from gpupool.nodeagent.monitor.state_writer import StateStore
from gpupool.nodeagent.monitor.usage_state import DeviceState, DeviceUsage, Holder, ProcessIdentity, UsageState

log = logging.getLogger(__name__)

IdentityResolver = Callable[[int], ProcessIdentity]
Undecided = Callable[[str], bool]
"""Namespace ("" for a pod not named) → whether a pod's holder there is undecided now
(:class:`~gpupool.nodeagent.monitor.pod_list_wait.PodListWait`)."""
Prioritizer = Callable[[ProcessIdentity, str], int | None]
"""The priority recorded for a new holder of a path (the lending rules; ``None``: none)."""
OpenListener = Callable[[str, Holder], None]
"""Told of every new holder after it is recorded (the lending rules enforce refusals through it)."""


def no_identity(pid: int) -> ProcessIdentity:
    """The resolver used when none is given: every process is in no known container."""
    return ProcessIdentity()


def never_undecided(namespace: str) -> bool:
    """Used when no wait is given: every holder is judged at once (no namespace can be infrastructure)."""
    return False


class UsageRecorder:
    """Holds the node's usage state, applies events to it and persists every change."""

    def __init__(self, node: str, paths: Iterable[str], state_file: StateStore, processes: ProcessTable, *,
                 identify: IdentityResolver = no_identity, decide: OpenDecider = allow_every_open,
                 clock: Callable[[], float] = time.time, ignore_pids: Iterable[int] | None = None,
                 undecided: Undecided = never_undecided) -> None:
        self._node = node
        self._file = state_file
        self._processes = processes
        self._identify = identify
        self._undecided = undecided
        self._decide = decide
        self._prioritize: Prioritizer | None = None
        self._on_open: OpenListener | None = None
        self._clock = clock
        self._ignore = frozenset(ignore_pids) if ignore_pids is not None else frozenset({os.getpid()})
        self._lock = threading.Lock()
        self._devices = {path: DeviceUsage(path) for path in dict.fromkeys(paths)}
        self._unjudged: set[tuple[int, int]] = set()
        """(pid, start time) of pods' holders restored from the file whose pod the directory did not
        know at the restore: whether they are infrastructure is decided again once it does."""
        self._updated = clock()
        self.released = 0
        """Holders dropped by :meth:`prune` since start (processes gone; metrics)."""

    @property
    def state(self) -> UsageState:
        """The current state (what the file holds after the last successful write)."""
        with self._lock:
            return self._snapshot()

    def registration(self) -> Registration:
        """What to hand the event source before it starts."""
        return Registration(sink=self.on_event, decide=self._ask)

    def use_rules(self, decide: OpenDecider, prioritize: Prioritizer, on_open: OpenListener) -> None:
        """Plug in the lending rules after the source started: who may open (added to the decider
        given at construction, e.g. the risk checks': an open is refused when either refuses; the
        earlier one is asked first), what priority a new holder is recorded at, and who hears of
        each new holder."""
        earlier = self._decide

        def both(event: DeviceEvent) -> Verdict:
            return Verdict.DENY if earlier(event) is Verdict.DENY else decide(event)

        self._decide, self._prioritize, self._on_open = both, prioritize, on_open

    def _ask(self, event: DeviceEvent) -> Verdict:
        """The decider the source calls: the one plugged in now (the ignored pids are never asked)."""
        if event.pid in self._ignore:
            return Verdict.ALLOW
        return self._decide(event)

    def restore(self) -> None:
        """Start from the previous agent's file, keep its live holders, add holders found now."""
        previous = self._file.load()
        with self._lock:
            if previous is not None:
                if previous.node != self._node:
                    log.warning("usage state file %s was written for node %r, this is %r; reading it anyway",
                                self._file.path, previous.node, self._node)
                for device in previous.devices:
                    if device.path not in self._devices:
                        log.info("dropping %s from the usage state: no longer watched", device.path)
                        continue
                    alive = tuple(h for h in device.holders if self._still_holding(h, device.path))
                    for gone in set(device.holders) - set(alive):
                        log.info("pid %d no longer holds %s (exited, reused or closed while the agent "
                                 "was down)", gone.pid, device.path)
                    kept = replace(device, holders=tuple(self._judged_again(h) for h in alive))
                    if not kept.users:
                        state = DeviceState.FREE
                    else:  # a holder the previous agent called infrastructure may not be one now
                        state = DeviceState.BUSY if device.state is DeviceState.FREE else device.state
                    self._devices[device.path] = replace(kept, state=state)
            self._add_unseen_holders()
            self._persist()

    def on_event(self, event: DeviceEvent) -> None:
        """Apply one open or close and write the file."""
        if event.pid in self._ignore or event.path not in self._devices:
            return
        new = None
        with self._lock:
            device = self._devices[event.path]
            if event.kind is EventKind.OPEN:
                new = self._open(device, event)
            else:
                closer = device.holder(event.pid)
                last_use = device.last_use if closer is not None and closer.infrastructure else event.time
                self._devices[event.path] = device.with_holders(
                    tuple(h for h in device.holders if self._still_holding(h, device.path)), last_use)
            self._persist()
        if new is not None:
            self._tell(event.path, new)

    def prune(self) -> int:
        """Drop holders that exited or no longer hold their file (periodically, and after restarts);
        returns how many were dropped, each logged and counted in :attr:`released`.

        Why report it: a holder dropped here is a process that died or let go without a close the
        source saw (a killed container, merged events); the card it held is free again from now on.
        """
        dropped: list[tuple[str, Holder]] = []
        with self._lock:
            for path, device in self._devices.items():
                alive = tuple(h for h in device.holders if self._still_holding(h, path))
                if alive != device.holders:
                    dropped.extend((path, h) for h in device.holders if h not in alive)
                    self._devices[path] = device.with_holders(alive, device.last_use)
            if dropped:
                self.released += len(dropped)
                self._unjudged &= {(h.pid, h.start_time) for d in self._devices.values() for h in d.holders}
                self._persist()
        for path, holder in dropped:
            who = f"{holder.namespace}/{holder.pod}/{holder.container or '?'}" if holder.pod else "no known pod"
            log.info("released %s: pid %d (%s) is gone or no longer holds it", path, holder.pid, who)
        return len(dropped)

    def identify_again(self) -> None:
        """Name the pod container of holders recorded before anyone could.

        A process in a real container typically opens its device the moment it starts, before
        kubelet reports the container's ID in the pod's status and the agent's pod watch learns it:
        the open is recorded with the cgroup's container ID only. Each call asks again for the
        holders still without a container name (same process: pid and start time), for the
        restored holders whose pod's infrastructure mark is owed and for the undecided ones, and
        writes the file when one changed. A holder named an infrastructure holder now leaves its
        card's users: a card only it holds is free again; an undecided one judged a tenant's joins
        them (its card is held from now on). The open listener hears of each holder that changed
        in more than being decided (named, or marked otherwise).
        """
        named: list[tuple[str, Holder]] = []
        decided = 0
        with self._lock:
            changed = False
            for path, device in self._devices.items():
                holders = tuple(self._named(h, path) if self._unnamed(h) else h for h in device.holders)
                if holders == device.holders:
                    continue
                changed = True
                self._devices[path] = device.with_holders(holders, device.last_use)
                for old, new in zip(device.holders, holders, strict=True):
                    decided += old.undecided and not new.undecided
                    if replace(old, undecided=False) != replace(new, undecided=False):
                        named.append((path, new))
            if changed:
                self._persist()
        if decided:
            log.info("%d holder(s) of pods recorded before the pod watch listed this node's pods judged now "
                     "(--infrastructure-namespaces)", decided)
        for path, holder in named:  # the rules could not place them at their open
            self._tell(path, holder)

    def _unnamed(self, holder: Holder) -> bool:
        """Whether to ask again who a holder is: its container has no name yet (a host daemon never
        joins one), it is a restored pod's holder whose infrastructure mark is owed, or it is
        undecided."""
        if holder.undecided or (holder.pid, holder.start_time) in self._unjudged:
            return True
        return not holder.container and not (holder.infrastructure and not holder.pod)

    def _named(self, holder: Holder, path: str) -> Holder:
        if self._processes.start_time(holder.pid) != holder.start_time:
            return holder
        named = self._holder(holder.pid, holder.start_time, holder.since, path)
        if not named.pod:  # the pod watch does not know its pod yet: asked again at the next call
            undecided = self._undecided(holder.namespace) if holder.pod else named.undecided
            return holder if undecided == holder.undecided else replace(holder, undecided=undecided)
        self._unjudged.discard((holder.pid, holder.start_time))
        if holder.container:  # a restored holder: only its mark is judged again
            return replace(holder, infrastructure=named.infrastructure, undecided=False)
        return replace(holder, container_id=named.container_id, container=named.container, pod=named.pod,
                       namespace=named.namespace, priority=named.priority, infrastructure=named.infrastructure,
                       undecided=False)

    def set_state(self, path: str, state: DeviceState) -> None:
        """Record busy or idle from the idle rule; a device nobody holds stays free."""
        with self._lock:
            device = self._devices.get(path)
            if device is None or not device.users or state is DeviceState.FREE or device.state is state:
                return
            self._devices[path] = replace(device, state=state)
            self._persist()

    def _open(self, device: DeviceUsage, event: DeviceEvent) -> Holder | None:
        known = device.holder(event.pid)
        if known is not None:
            last_use = device.last_use if known.infrastructure else event.time
            self._devices[device.path] = device.with_holders(device.holders, last_use)
            return None
        start = self._processes.start_time(event.pid)
        if start is None:
            log.info("pid %d opened %s and exited before it was recorded", event.pid, device.path)
            self._devices[device.path] = device.with_holders(device.holders, event.time)
            return None
        holder = self._holder(event.pid, start, event.time, device.path)
        last_use = device.last_use if holder.infrastructure else event.time
        self._devices[device.path] = device.with_holders((*device.holders, holder), last_use)
        return holder

    def _tell(self, path: str, holder: Holder) -> None:
        """Hand a new (or newly named) holder to the open listener, outside the lock (it reads the state)."""
        if self._on_open is None:
            return
        try:
            self._on_open(path, holder)
        except Exception:
            log.exception("the open listener failed on %s by pid %d", path, holder.pid)

    def _judged_again(self, holder: Holder) -> Holder:
        """A restored holder, marked infrastructure or not by this agent's settings (the file may be an
        older agent's, or one started with other ``--infrastructure-*`` settings). A host process is
        judged now; a pod's process when its pod is known (the pod watch starts after the restore:
        until then it keeps the previous agent's mark, undecided while the watch has not listed and
        its namespace is listed, see :meth:`identify_again`); one in a container not named yet is
        named, and judged, by :meth:`identify_again` (undecided until the list is in)."""
        if holder.container_id and not holder.pod:
            undecided = self._undecided("")
            return holder if undecided == holder.undecided else replace(holder, undecided=undecided)
        who = self._resolve(holder.pid)
        if holder.pod:
            if not who.pod:
                self._unjudged.add((holder.pid, holder.start_time))
                undecided = self._undecided(holder.namespace)
                return holder if undecided == holder.undecided else replace(holder, undecided=undecided)
            infrastructure = who.infrastructure
        else:
            infrastructure = who.infrastructure if not who.container_id and not who.pod else ""
        judged = replace(holder, infrastructure=infrastructure, undecided=False)
        return holder if judged == holder else judged

    def _resolve(self, pid: int) -> ProcessIdentity:
        try:
            return self._identify(pid)
        except Exception:
            log.exception("could not tell which container pid %d runs in", pid)
            return ProcessIdentity()

    def _holder(self, pid: int, start: int, since: float, path: str = "") -> Holder:
        who = self._resolve(pid)
        undecided = bool(who.container_id) and not who.pod and self._undecided("")
        priority = None
        if self._prioritize is not None and path:
            try:
                priority = self._prioritize(who, path)
            except Exception:
                log.exception("could not tell the priority of pid %d", pid)
        return Holder(pid=pid, start_time=start, since=since, container_id=who.container_id,
                      container=who.container, pod=who.pod, namespace=who.namespace, priority=priority,
                      infrastructure=who.infrastructure, undecided=undecided)

    def _still_holding(self, holder: Holder, path: str) -> bool:
        return (self._processes.start_time(holder.pid) == holder.start_time
                and self._processes.holds(holder.pid, path))

    def _add_unseen_holders(self) -> None:
        now = self._clock()
        for path, pids in self._processes.holders().items():
            device = self._devices.get(path)
            if device is None:
                continue
            new = []
            for pid in sorted(pids - {h.pid for h in device.holders} - self._ignore):
                start = self._processes.start_time(pid)
                if start is not None:
                    new.append(self._holder(pid, start, now))
            if new:
                self._devices[path] = device.with_holders((*device.holders, *new), device.last_use)

    def _snapshot(self) -> UsageState:
        return UsageState(self._node, self._updated, tuple(self._devices[p] for p in sorted(self._devices)))

    def _persist(self) -> None:
        self._updated = self._clock()
        try:
            self._file.write(self._snapshot())
        except OSError as exc:
            log.error("cannot write the usage state file %s (%s); the state is kept in memory and "
                      "written with the next change", self._file.path, exc.strerror)
