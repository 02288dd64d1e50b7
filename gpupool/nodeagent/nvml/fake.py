"""A fake GPU backend described by a YAML file: cards, topology, and failures over time.

Format (all keys but ``cards`` optional)::

    cards:
      - {uuid: GPU-aaaa, model: NVIDIA-H200, memoryMiB: 143771}
      - {uuid: GPU-bbbb, model: NVIDIA-H200, memoryMiB: 143771, healthy: false}
    topology: [[0, 1], [2, 3]]      # nested groups (see Topology.from_tree) or
    links: [[0, 1], [1, 0]]         # a full matrix of LinkLevel numbers
    devicePathPrefix: /dev/nvidia   # device nodes are <prefix><index>
    events:                         # applied in time order, seconds after start
      - {at: 2.0, card: 1, xid: 79}        # critical XID -> unhealthy
      - {at: 2.5, card: 1, xid: 13}        # application XID -> ignored
      - {at: 4.0, card: 1, recover: true}  # healthy again
      - {at: 6.0, card: 0, lost: true}     # fell off the bus -> unhealthy

Why time-scripted events: the health path (ListAndWatch updates, kubelet allocatable) must be
tested without hardware, deterministically, and the same file drives the CLI for demos.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from gpupool.core.model import GpuCard, LinkLevel, Topology
from gpupool.nodeagent.nvml.backend import GpuInventory, HealthEvent, xid_is_critical


class FakeGpuFileError(ValueError):
    """The fake-GPU YAML file is malformed; the message names the entry."""


@dataclass(frozen=True)
class ScriptedEvent:
    """One line of the ``events`` list."""

    at: float
    card: int
    kind: str  # "xid", "recover", "lost"
    xid: int = 0


class FakeGpuBackend:
    """Serves a fixed inventory and replays scripted health events (or ones injected by tests)."""

    def __init__(self, cards: list[GpuCard], topology: Topology, device_paths: list[str],
                 events: list[ScriptedEvent] | None = None) -> None:
        self._cards = {c.index: c for c in cards}
        self._topology = topology
        self._paths = device_paths
        self._script = sorted(events or [], key=lambda e: e.at)
        # Created up front so that events injected before anyone watches are not lost.
        self._injected: asyncio.Queue[HealthEvent] = asyncio.Queue()

    @staticmethod
    def from_file(path: str | Path) -> FakeGpuBackend:
        """Read the YAML description (see module doc)."""
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
        return FakeGpuBackend.from_dict(data, source=str(path))

    @staticmethod
    def from_dict(data: Any, source: str = "<dict>") -> FakeGpuBackend:
        """Build from the already-parsed YAML structure."""
        if not isinstance(data, dict) or not isinstance(data.get("cards"), list):
            raise FakeGpuFileError(f"{source}: expected a mapping with a 'cards' list")
        cards: list[GpuCard] = []
        for i, raw in enumerate(data["cards"]):
            if not isinstance(raw, dict):
                raise FakeGpuFileError(f"{source}: cards[{i}] must be a mapping")
            try:
                cards.append(GpuCard(index=int(raw.get("index", i)),
                                     uuid=str(raw.get("uuid", f"GPU-fake-{i:04d}")),
                                     model=str(raw.get("model", data.get("model", "FAKE-GPU"))),
                                     memory_mib=int(raw["memoryMiB"]),
                                     healthy=bool(raw.get("healthy", True))))
            except (KeyError, TypeError, ValueError) as exc:
                raise FakeGpuFileError(f"{source}: cards[{i}]: {exc}") from exc
        count = len(cards)
        if "links" in data:
            topology = Topology(tuple(tuple(LinkLevel(int(v)) for v in row) for row in data["links"]))
        elif "topology" in data:
            topology = Topology.from_tree(data["topology"], count)
        else:
            topology = Topology.flat(count)
        prefix = str(data.get("devicePathPrefix", "/dev/nvidia"))
        paths = [f"{prefix}{c.index}" for c in cards]
        events: list[ScriptedEvent] = []
        for i, raw in enumerate(data.get("events") or []):
            try:
                kind = "recover" if raw.get("recover") else "lost" if raw.get("lost") else "xid"
                events.append(ScriptedEvent(at=float(raw["at"]), card=int(raw["card"]), kind=kind,
                                            xid=int(raw.get("xid", 0))))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise FakeGpuFileError(f"{source}: events[{i}]: {exc}") from exc
        return FakeGpuBackend(cards, topology, paths, events)

    def inventory(self) -> GpuInventory:
        """The cards with their current health."""
        cards = tuple(self._cards[i] for i in sorted(self._cards))
        return GpuInventory(cards=cards, topology=self._topology, device_paths=tuple(self._paths))

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

    def close(self) -> None:
        """Nothing to release."""
