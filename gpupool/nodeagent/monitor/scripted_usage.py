"""Usage samples replayed from a script, so that tests cover hours of GPU use in seconds.

The script is the ``usage`` key of the fake-GPU YAML file (the fake backend ignores it; its
``cards`` give the memory totals), or a file of its own with the same two keys::

    cards:
      - {memoryMiB: 16384}
      - {memoryMiB: 16384}
    usage:                        # steps: a card keeps a step's values until its next step
      - {at: 0,     card: 0, utilization: 80, processes: [{pid: 100, memoryMiB: 4000, sm: 80}]}
      - {at: 2h,    card: 0, utilization: 0,  processes: [{pid: 100, memoryMiB: 4000, sm: 0}]}
      - {at: 1h30m, card: 1, utilization: 5}

``at`` is seconds after the start (a number, or ``90s``/``15m``/``2h``/``1h30m``); memory used
defaults to the sum of the processes' memory. Time comes from the clock given (a test's virtual
clock); the script starts at the clock's first reading.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpupool.nodeagent.monitor.usage_sampling import CardUsage, ProcessUsage, UsageSample

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")
_SECONDS_PER = (3600.0, 60.0, 1.0)


class UsageScriptError(ValueError):
    """The usage script is malformed; the message names the entry."""


@dataclass(frozen=True)
class _Step:
    at: float
    card: CardUsage


def parse_duration(value: object) -> float:
    """Seconds from a number or a ``1h30m``-style string."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip())
        if not match or not any(match.groups()):
            raise ValueError(f"not a duration: {value!r} (use seconds or e.g. 1h30m)")
        seconds = sum(float(g) * unit for g, unit in zip(match.groups(), _SECONDS_PER, strict=True) if g)
    if seconds < 0:
        raise ValueError(f"negative time {value!r}")
    return seconds


class ScriptedUsage:
    """A :class:`~gpupool.nodeagent.monitor.usage_sampling.UsageSampler` that replays a script."""

    def __init__(self, memory_total_mib: list[int], steps: list[_Step], clock: Callable[[], float]) -> None:
        self._totals = memory_total_mib
        self._clock = clock
        self._start: float | None = None
        self._steps: dict[int, list[_Step]] = {i: [] for i in range(len(memory_total_mib))}
        for scripted in sorted(steps, key=lambda s: s.at):
            self._steps[scripted.card.index].append(scripted)
        self._times = {i: [s.at for s in steps] for i, steps in self._steps.items()}

    @staticmethod
    def from_file(path: str | Path, clock: Callable[[], float]) -> ScriptedUsage:
        """Read a fake-GPU YAML file with a ``usage`` key (module doc)."""
        with open(path, encoding="utf-8") as fh:
            return ScriptedUsage.from_dict(yaml.safe_load(fh), clock, source=str(path))

    @staticmethod
    def from_dict(data: Any, clock: Callable[[], float], source: str = "<dict>") -> ScriptedUsage:
        """Build from the parsed YAML."""
        if not isinstance(data, dict) or not isinstance(data.get("cards"), list):
            raise UsageScriptError(f"{source}: expected a mapping with a 'cards' list")
        try:
            totals = [int(card["memoryMiB"]) for card in data["cards"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageScriptError(f"{source}: cards: every card needs memoryMiB ({exc})") from exc
        steps = [_parse_step(raw, totals, f"{source}: usage[{i}]") for i, raw in enumerate(data.get("usage") or [])]
        return ScriptedUsage(totals, steps, clock)

    def sample(self) -> UsageSample:
        """Every card as the script has it at the clock's current time."""
        now = self._clock()
        if self._start is None:
            self._start = now
        elapsed = now - self._start
        cards = []
        for index, total in enumerate(self._totals):
            position = bisect.bisect_right(self._times[index], elapsed)
            cards.append(self._steps[index][position - 1].card if position else CardUsage(index, 0, 0, total))
        return UsageSample(now, tuple(cards))


def _parse_step(raw: Any, totals: list[int], where: str) -> _Step:
    try:
        index = int(raw["card"])
        if not 0 <= index < len(totals):
            raise ValueError(f"card {index} is not one of the {len(totals)} cards")
        processes = tuple(ProcessUsage(pid=int(p["pid"]), memory_used_mib=int(p.get("memoryMiB", 0)),
                                       sm_percent=None if p.get("sm") is None else _percent(p["sm"]))
                          for p in raw.get("processes") or [])
        used = int(raw.get("memoryUsedMiB", sum(p.memory_used_mib for p in processes)))
        card = CardUsage(index, _percent(raw.get("utilization", 0)), used, totals[index], processes)
        return _Step(parse_duration(raw["at"]), card)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageScriptError(f"{where}: {exc}") from exc


def _percent(value: Any) -> int:
    percent = int(value)
    if not 0 <= percent <= 100:
        raise ValueError(f"{percent} is not a percentage")
    return percent
