"""The NVML usage sampler against a stub of pynvml (no GPU here): what each call's answer and error
turns into. A card that cannot be read is left out (the idle rule counts it as active)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from gpupool.nodeagent.monitor.usage_sampling import CardUsage, ProcessUsage
from gpupool.nodeagent.nvml.usage import MIB, NvmlUsageSampler

NOT_FOUND = 6


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class StubNvml:
    """Per card handle: utilisation, memory (MiB), processes (pid, MiB or None), SM samples, errors."""

    cards: list[dict[str, Any]] = field(default_factory=list)
    NVML_ERROR_NOT_FOUND: int = NOT_FOUND
    since: list[int] = field(default_factory=list)

    def _fail(self, card: dict[str, Any], call: str) -> None:
        if call in card.get("errors", {}):
            raise NVMLError(card["errors"][call])

    def nvmlDeviceGetUtilizationRates(self, h: dict[str, Any]) -> Any:
        self._fail(h, "util")
        return SimpleNamespace(gpu=h["util"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> Any:
        self._fail(h, "memory")
        return SimpleNamespace(used=h["used"] * MIB, total=h["total"] * MIB, free=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> Any:
        self._fail(h, "processes")
        return [SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * MIB)
                for pid, mib in h.get("processes", [])]

    def nvmlDeviceGetProcessUtilization(self, h: dict[str, Any], since: int) -> Any:
        self.since.append(since)
        self._fail(h, "sm")
        return [SimpleNamespace(pid=pid, smUtil=sm, memUtil=0, timeStamp=stamp) for pid, sm, stamp in h.get("sm", [])]


CARD = {"util": 40, "used": 3000, "total": 16384, "processes": [(200, 1000), (100, 2000)],
        "sm": [(100, 30, 5_000_000_001), (200, 10, 5_000_000_002), (100, 35, 5_000_000_003)]}


@pytest.mark.parametrize(("card", "expected"), [
    pytest.param(CARD, CardUsage(0, 40, 3000, 16384, (ProcessUsage(100, 2000, 35), ProcessUsage(200, 1000, 10))),
                 id="processes-with-memory-and-their-highest-sm-share"),
    pytest.param({**CARD, "errors": {"util": 999}}, None, id="unreadable-utilisation-leaves-the-card-out"),
    pytest.param({**CARD, "errors": {"memory": 15}}, None, id="unreadable-memory-leaves-the-card-out"),
    pytest.param({**CARD, "errors": {"processes": 999}}, CardUsage(0, 40, 3000, 16384),
                 id="unlisted-processes-keep-the-card-utilisation"),
    pytest.param({**CARD, "errors": {"sm": NOT_FOUND}},
                 CardUsage(0, 40, 3000, 16384, (ProcessUsage(100, 2000, None), ProcessUsage(200, 1000, None))),
                 id="no-kernel-since-the-last-sample-means-no-sm-share"),
    pytest.param({**CARD, "errors": {"sm": 3}, "processes": [(100, None)]},
                 CardUsage(0, 40, 3000, 16384, (ProcessUsage(100, 0, None),)),
                 id="memory-hidden-by-the-driver-and-sm-unsupported"),
])
def test_one_card(card: dict[str, Any], expected: CardUsage | None) -> None:
    stub = StubNvml([card])
    sample = NvmlUsageSampler(stub, lambda: stub.cards, clock=lambda: 10.0).sample()
    assert sample.time == 10.0
    assert sample.cards == (() if expected is None else (expected,))


def test_per_process_utilisation_is_asked_since_the_last_sample_seen() -> None:
    stub = StubNvml([CARD, {**CARD, "sm": []}])
    sampler = NvmlUsageSampler(stub, lambda: stub.cards, clock=lambda: 10.0)
    sampler.sample()
    sampler.sample()
    assert stub.since == [5_000_000, 5_000_000, 5_000_000_003, 5_000_000]
    assert [c.index for c in sampler.sample().cards] == [0, 1]


def test_a_card_that_fails_does_not_hide_the_others(caplog: pytest.LogCaptureFixture) -> None:
    stub = StubNvml([{**CARD, "errors": {"util": 15}}, CARD])
    sampler = NvmlUsageSampler(stub, lambda: stub.cards, clock=lambda: 10.0)
    assert [c.index for c in sampler.sample().cards] == [1]
    sampler.sample()
    assert caplog.text.count("card 0: NVML cannot read utilisation or memory") == 1  # once, not per sample
