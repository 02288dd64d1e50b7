"""The usage monitor as the node agent runs it: source, recorder, state file, sampling and idle rule.

Start-up order follows the patent (claim 3): the recorder restores the previous state file, then
registers with the event source, and only then does the source start. The sampling loop runs on the
agent's event loop; the blocking parts (an NVML sample, a /proc prune) run in worker threads so that
kubelet's device-plugin calls are never held up by them.

Nothing here stops the agent: a sampler error is logged and the cards count as active (busy, never
idle, never free), a source that fails to start falls back to the /proc scan, a state-change
listener that fails is logged. A card is free only when the recorder, which keeps holders honest
against /proc, has no live holder for it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.linux.watched_files import WatchedFiles
from gpupool.nodeagent.monitor.container_resolver import ContainerResolver
from gpupool.nodeagent.monitor.events import EventSource, OpenDecider, allow_every_open
from gpupool.nodeagent.monitor.idle import DEFAULT_IDLE_AFTER_SECONDS, IdleDetector
from gpupool.nodeagent.monitor.pod_list_wait import POD_LIST_WAIT_S, PodListWait
from gpupool.nodeagent.monitor.proc_scan_source import ProcScanSource
from gpupool.nodeagent.monitor.process_table import ProcessTable, ProcfsTable
from gpupool.nodeagent.monitor.recorder import IdentityResolver, UsageRecorder
from gpupool.nodeagent.monitor.source_selector import SourceChoice, choose_source
from gpupool.nodeagent.monitor.state_file import DEFAULT_STATE_PATH, StateFile
from gpupool.nodeagent.monitor.state_writer import BackgroundStateWriter
from gpupool.nodeagent.monitor.usage_sampling import UsageSample, UsageSampler
from gpupool.nodeagent.monitor.usage_state import DeviceState, Holder, UsageState

log = logging.getLogger(__name__)

SAMPLE_EVERY_SECONDS = 1.0
PRUNE_EVERY_SECONDS = 30.0


NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A namespace's name (an RFC 1123 label, as the API server requires)."""

DEFAULT_INFRASTRUCTURE_HOLDERS = ("nvidia-persistenced", "nv-hostengine", "dcgm-exporter")
"""Host daemons that keep GPU device files open on production nodes without working on the cards:
NVIDIA's persistence daemon, DCGM's host engine and the DCGM exporter (embedded engine)."""


@dataclass(frozen=True)
class MonitorConfig:
    """The agent's ``--usage-*``, ``--idle-after`` and ``--infrastructure-*`` options."""

    state_path: str = DEFAULT_STATE_PATH
    idle_after: float = DEFAULT_IDLE_AFTER_SECONDS
    sample_every: float = SAMPLE_EVERY_SECONDS
    prune_every: float = PRUNE_EVERY_SECONDS
    infrastructure: tuple[str, ...] = DEFAULT_INFRASTRUCTURE_HOLDERS
    """Executable names of host processes (in no pod) whose holds are infrastructure, not use
    (docs/monitor.md, "Infrastructure holders"); empty: every holder counts."""
    infrastructure_namespaces: tuple[str, ...] = ()
    """Namespaces whose pods, when they asked for no GPU (gpupool's or another device plugin's), are
    infrastructure holders (the GPU Operator's DaemonSets); empty: none. Only the admin's list counts:
    tenants must not be able to create pods in these namespaces (docs/monitor.md, "Infrastructure
    pods")."""
    pod_list_wait_s: float = POD_LIST_WAIT_S
    """How long, at most, pods' holders stay undecided while the pod watch has not listed the node's
    pods (only where ``infrastructure_namespaces`` lists one: :mod:`.pod_list_wait`)."""

    def __post_init__(self) -> None:
        for name in self.infrastructure:
            if not name or "/" in name or name != name.strip():
                raise ValueError(f"infrastructure holder {name!r}: give an executable's file name, without "
                                 "a directory or spaces around it")
        for namespace in self.infrastructure_namespaces:
            if not NAMESPACE_NAME.fullmatch(namespace):
                raise ValueError(f"infrastructure namespace {namespace!r}: give a namespace's name (lower-case "
                                 "letters, digits and '-', at most 63 characters)")


@dataclass(frozen=True)
class StateChange:
    """A card device went busy → idle or idle → busy, with the holders at that moment."""

    path: str
    card: int
    previous: DeviceState
    current: DeviceState
    holders: tuple[Holder, ...]
    time: float


StateListener = Callable[[StateChange], Awaitable[None]]


class UsageMonitor:
    """Owns the monitor's parts for the node agent; :meth:`start`, then :meth:`run`, then :meth:`stop`."""

    def __init__(self, node: str, cards: dict[str, int], control_devices: Sequence[str],
                 sampler: UsageSampler, config: MonitorConfig = MonitorConfig(), *,
                 directory: InMemoryContainerDirectory | None = None,
                 choose: Callable[[Sequence[str]], SourceChoice] = choose_source,
                 processes: ProcessTable | None = None, identify: IdentityResolver | None = None,
                 on_change: StateListener | None = None, clock: Callable[[], float] = time.time,
                 decide: OpenDecider = allow_every_open, ignore_pids: Iterable[int] | None = None) -> None:
        """``ignore_pids``: processes whose opens are never recorded; by default the agent's own (its
        NVML calls open the cards, and that is not a tenant's use). A test that scripts opens by
        made-up pids passes ``()``: one of them may be the test process's own pid, which the default
        would silently drop."""
        self.node = node
        self.cards = dict(cards)
        """Card device path → card index."""
        self.paths = (*self.cards, *(p for p in control_devices if p not in self.cards))
        self.config = config
        self.directory = directory or InMemoryContainerDirectory()
        self.transitions: Counter[tuple[int, DeviceState]] = Counter()
        """(card, new state) → how often a card went busy/idle (metrics)."""
        self.sample_errors = 0
        self.last_sample: UsageSample | None = None
        self._sampler = sampler
        self._choose = choose
        self._clock = clock
        self._on_change = on_change
        self._writer = BackgroundStateWriter(StateFile(config.state_path))
        self.recorder = UsageRecorder(node, self.paths, self._writer,
                                      processes or ProcfsTable(WatchedFiles(self.paths)),
                                      identify=identify or self.resolver(),
                                      clock=clock,
                                      decide=decide,
                                      ignore_pids=ignore_pids,
                                      undecided=PodListWait(lambda: self.directory.listed,
                                                            frozenset(config.infrastructure_namespaces),
                                                            deadline_s=config.pod_list_wait_s, clock=clock))
        self.detector = IdleDetector(self.cards, idle_after=config.idle_after)
        self.source: EventSource | None = None
        self.source_reason = ""
        self.gate_available = False
        """Whether the start-up probe found the cgroup-device gate usable (refusal at open per container)."""
        self.gate_reason = "not probed"
        self._listeners: set[asyncio.Task[None]] = set()

    @property
    def state(self) -> UsageState:
        """The recorded state now."""
        return self.recorder.state

    def resolver(self) -> ContainerResolver:
        """A resolver of pids on this monitor's directory that names infrastructure holders as the
        monitor's settings say (the recorder's, and the lending rules' for the opens they answer)."""
        return ContainerResolver(self.directory, infrastructure=frozenset(self.config.infrastructure),
                                 infrastructure_namespaces=frozenset(self.config.infrastructure_namespaces))

    def start(self) -> None:
        """Restore the state file, register the recorder with the chosen source, start it."""
        self._writer.start()
        self.recorder.restore()
        choice = self._choose(self.paths)
        self.source, self.source_reason = choice.source, choice.reason
        self.gate_available, self.gate_reason = choice.gate_available, choice.gate_reason
        self.source.register(self.recorder.registration())  # claim 3: before events flow
        try:
            self.source.start()
        except Exception as exc:
            log.error("usage monitor source %s failed to start (%s); falling back to the /proc scan",
                      self.source.name, exc)
            self.source = ProcScanSource(self.paths)
            self.source_reason = f"{choice.source.name} failed to start: {exc}"
            self.source.register(self.recorder.registration())
            self.source.start()

    def stop(self) -> None:
        """Stop the source and write what is queued; idempotent."""
        if self.source is not None:
            self.source.stop()
        self._writer.stop()

    async def run(self) -> None:
        """Sample, apply the idle rule and name newly known holders every ``sample_every``; prune every
        ``prune_every``."""
        next_prune = self._clock() + self.config.prune_every
        while True:
            try:
                await self.step()
                await asyncio.to_thread(self.recorder.identify_again)
                if self._clock() >= next_prune:
                    next_prune = self._clock() + self.config.prune_every
                    await asyncio.to_thread(self.recorder.prune)
            except Exception:  # a bug here must not take the device plugin down with it
                log.exception("usage monitor step failed; the state stands, retrying at the next sample")
            await asyncio.sleep(self.config.sample_every)

    async def step(self) -> list[StateChange]:
        """One sample through the idle rule; the busy/idle changes it caused."""
        sample = await asyncio.to_thread(self._sample)
        self.last_sample = sample
        changes: list[StateChange] = []
        for path, new in self.detector.observe(self.recorder.state, sample).items():
            device = self.recorder.state.device(path)
            previous = device.state if device is not None else DeviceState.FREE
            self.recorder.set_state(path, new)
            if new is DeviceState.FREE or previous is new or device is None or not device.holders:
                continue
            change = StateChange(path, self.cards[path], previous, new, device.holders, sample.time)
            self.transitions[(change.card, new)] += 1
            log.info("card %d (%s) %s -> %s, held by %s", change.card, path, previous, new,
                     ", ".join(f"{h.namespace}/{h.pod}/{h.container or '?'} (pid {h.pid})" if h.pod
                               else f"pid {h.pid}" for h in device.holders))
            changes.append(change)
            self._notify(change)
        return changes

    def idle_seconds(self, path: str) -> float:
        """Seconds the card has been held without activity (0 when free or busy)."""
        return self.detector.idle_seconds(path, self._clock())

    def _sample(self) -> UsageSample:
        try:
            return self._sampler.sample()
        except Exception as exc:
            self.sample_errors += 1
            log.warning("usage sample failed (%s: %s); every card counts as active", type(exc).__name__, exc)
            return UsageSample(self._clock(), ())

    def _notify(self, change: StateChange) -> None:
        if self._on_change is None:
            return
        task = asyncio.get_running_loop().create_task(self._deliver(self._on_change, change))
        self._listeners.add(task)
        task.add_done_callback(self._listeners.discard)

    @staticmethod
    async def _deliver(listener: StateListener, change: StateChange) -> None:
        try:
            await listener(change)
        except Exception as exc:
            log.warning("could not report card %d going %s: %s", change.card, change.current, exc)
