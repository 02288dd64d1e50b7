"""A fake GPU backend described by a YAML file: cards, topology, and failures over time.

Format (all keys but ``cards`` and each card's ``memoryMiB`` optional)::

    model: NVIDIA-H200              # every card's model unless the card names its own
    cards:                          # index defaults to the position, uuid to GPU-fake-<position>
      - {uuid: GPU-aaaa, memoryMiB: 143771}
      - {index: 1, uuid: GPU-bbbb, model: NVIDIA-H200, memoryMiB: 143771, healthy: false,
         pciBusId: "00000000:3B:00.0"}  # NVML's PCI address (names the card's dmem region)
      - {uuid: MIG-cccc, memoryMiB: 71424, kind: virtual, computeMilli: 428,   # a MIG instance, as the
         profile: 3g.71gb, parent: GPU-aaaa}                                 # NVML backend publishes it
    topology: [[0, 1], [2, 3]]      # nested groups of card positions (Topology.from_tree) or
    links: [[0, 1], [1, 0]]         # a full matrix of LinkLevel numbers
    devicePathPrefix: /dev/nvidia   # device nodes are <prefix><index>
    events:                         # applied in time order, seconds after start
      - {at: 2.0, card: 1, xid: 79}        # critical XID -> unhealthy
      - {at: 2.5, card: 1, xid: 13}        # application XID -> ignored
      - {at: 4.0, card: 1, recover: true}  # healthy again
      - {at: 6.0, card: 0, lost: true}     # fell off the bus -> unhealthy
    usage:                          # what the usage monitor samples (gpupool.nodeagent.monitor.scripted_usage)
      - {at: 0, card: 0, utilization: 80, processes: [{pid: 100, memoryMiB: 4000, sm: 80}]}
      - {at: 2h, card: 0, utilization: 0}

Every field is checked when the file is loaded (:mod:`gpupool.nodeagent.nvml.fake_file`): a file
whose inventory the extender would refuse stops the agent at start with the file and field named.

Why time-scripted events: the health path (ListAndWatch updates, kubelet allocatable) must be
tested without hardware, deterministically, and the same file drives the CLI for demos.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gpupool.core.model import GpuCard, Topology
from gpupool.nodeagent.monitor.scripted_usage import ScriptedUsage, UsageScriptError
from gpupool.nodeagent.monitor.usage_sampling import CardUsage, UsageSample
from gpupool.nodeagent.nvml.backend import GpuInventory, HealthEvent, xid_is_critical
from gpupool.nodeagent.nvml.fake_file import FakeGpuFileError, ScriptedEvent, read_fake_gpu_file

__all__ = ["FakeGpuBackend", "FakeGpuFileError", "ScriptedEvent"]


class FakeGpuBackend:
    """Serves a fixed inventory and replays scripted health events (or ones injected by tests)."""

    def __init__(self, cards: list[GpuCard], topology: Topology, device_paths: list[str],
                 events: list[ScriptedEvent] | None = None, usage: ScriptedUsage | None = None,
                 pci_bus_ids: tuple[str, ...] = ()) -> None:
        self._cards = {c.index: c for c in cards}
        self._pci = dict(zip((c.index for c in cards), pci_bus_ids, strict=False))
        self._positions = [c.index for c in cards]
        self._topology = topology
        self._paths = device_paths
        self._usage = usage
        self._script = sorted(events or [], key=lambda e: e.at)
        # Created up front so that events injected before anyone watches are not lost.
        self._injected: asyncio.Queue[HealthEvent] = asyncio.Queue()

    @staticmethod
    def from_file(path: str | Path) -> FakeGpuBackend:
        """Read and validate the YAML description (see module doc); :class:`FakeGpuFileError` names
        the file and the field of anything the extender would refuse to read back."""
        with open(path, encoding="utf-8") as fh:
            try:
                data = yaml.safe_load(fh)
            except (yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: an int past 4,300 digits
                raise FakeGpuFileError(f"{path}: not a YAML document ({str(exc)[:200]})") from None
        return FakeGpuBackend.from_dict(data, source=str(path))

    @staticmethod
    def from_dict(data: Any, source: str = "<dict>", clock: Callable[[], float] = time.time) -> FakeGpuBackend:
        """Build from the already-parsed YAML structure (validated as :func:`read_fake_gpu_file` says);
        the ``usage`` script, if any, replays on ``clock`` from the first sample."""
        spec = read_fake_gpu_file(data, source)
        usage = None
        if data.get("usage") is not None:
            try:
                usage = ScriptedUsage.from_dict(data, clock, source=source)
            except UsageScriptError as exc:
                raise FakeGpuFileError(str(exc)) from None
        return FakeGpuBackend(list(spec.cards), spec.topology, list(spec.device_paths), list(spec.events), usage,
                              spec.pci_bus_ids)

    def inventory(self) -> GpuInventory:
        """The cards with their current health."""
        cards = tuple(self._cards[i] for i in sorted(self._cards))
        return GpuInventory(cards=cards, topology=self._topology, device_paths=tuple(self._paths),
                            pci_bus_ids=tuple(self._pci.get(c.index, "") for c in cards))

    def inject(self, event: HealthEvent) -> None:
        """Apply a health change now (tests); it is also emitted by :meth:`health_events`."""
        self._apply(event)
        self._injected.put_nowait(event)

    def _apply(self, event: HealthEvent) -> None:
        card = self._cards.get(event.card)
        if card is not None:
            self._cards[event.card] = replace(card, healthy=event.healthy)

    def _translate(self, scripted: ScriptedEvent) -> HealthEvent | None:
        if scripted.kind == "recover":
            return HealthEvent(scripted.card, True, "recovered")
        if scripted.kind == "lost":
            return HealthEvent(scripted.card, False, "GPU lost (fell off the bus)")
        if not xid_is_critical(scripted.xid):
            return None
        return HealthEvent(scripted.card, False, f"XID {scripted.xid}")

    async def health_events(self) -> AsyncIterator[HealthEvent]:
        """Replay the script relative to the first call, interleaved with injected events."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        script = list(self._script)
        while True:
            timeout = None
            if script:
                timeout = max(0.0, script[0].at - (loop.time() - start))
            try:
                yield await asyncio.wait_for(self._injected.get(), timeout)
                continue
            except TimeoutError:
                pass
            scripted = script.pop(0)
            event = self._translate(scripted)
            if event is not None:
                self._apply(event)
                yield event

    def sample_usage(self) -> UsageSample:
        """The ``usage`` script at this moment (cards by their index); without a script every card
        is unused, with its memory total."""
        if self._usage is None:
            cards = tuple(CardUsage(c.index, 0, 0, c.memory_mib) for c in self.inventory().cards)
            return UsageSample(time.time(), cards)
        sample = self._usage.sample()
        return UsageSample(sample.time, tuple(replace(card, index=self._positions[card.index])
                                              for card in sample.cards))

    def close(self) -> None:
        """Nothing to release."""
