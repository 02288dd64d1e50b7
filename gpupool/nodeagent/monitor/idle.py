"""The idle rule (claim 4): a card held by a container with no SM activity for the idle time is idle.

A pure state machine per card, fed one usage sample at a time. The transitions, as a table:

=========  ==============================  =========  =============================
held?      activity                        from       to (last activity)
=========  ==============================  =========  =============================
no         any                             any        free (unchanged)
yes        SM activity, or an open/close   any        busy (now / that event's time)
yes        none                            free       busy (now: taking a card is use)
yes        none for >= the idle time       busy/idle  idle
yes        none for < the idle time        busy/idle  unchanged
=========  ==============================  =========  =============================

Held means held by a user: an infrastructure holder (a host daemon such as nvidia-persistenced
that keeps the device open and does no work, :attr:`DeviceUsage.users`) alone leaves a card free.
SM activity is the card's utilisation or any process's SM share above the threshold (default 0 %:
anything at all counts). Control devices (no card index) are not subject to the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpupool.nodeagent.monitor.usage_sampling import CardUsage, UsageSample
from gpupool.nodeagent.monitor.usage_state import DeviceState, UsageState

DEFAULT_IDLE_AFTER_SECONDS = 600.0
DEFAULT_ACTIVE_ABOVE_PERCENT = 0


@dataclass(frozen=True)
class CardActivity:
    """What the rule remembers about one card."""

    state: DeviceState = DeviceState.FREE
    last_active: float | None = None


def is_active(card: CardUsage, above_percent: int = DEFAULT_ACTIVE_ABOVE_PERCENT) -> bool:
    """Whether the card's SMs did anything in the sample."""
    return card.utilization_percent > above_percent or any(
        p.sm_percent is not None and p.sm_percent > above_percent for p in card.processes)


def step(previous: CardActivity, *, held: bool, active: bool, last_open: float | None, now: float,
         idle_after: float) -> CardActivity:
    """The card's activity after one sample (the table in the module doc)."""
    if not held:
        return CardActivity(DeviceState.FREE, previous.last_active)
    if active:
        return CardActivity(DeviceState.BUSY, now)
    last = previous.last_active
    if last_open is not None and (last is None or last_open > last):
        return CardActivity(DeviceState.BUSY, last_open)
    if previous.state is DeviceState.FREE or last is None:
        return CardActivity(DeviceState.BUSY, now)
    if now - last >= idle_after:
        return CardActivity(DeviceState.IDLE, last)
    return CardActivity(previous.state, last)


class IdleDetector:
    """Runs :func:`step` for every card device and reports the states that changed."""

    def __init__(self, card_of_path: Mapping[str, int], *, idle_after: float = DEFAULT_IDLE_AFTER_SECONDS,
                 active_above_percent: int = DEFAULT_ACTIVE_ABOVE_PERCENT) -> None:
        if idle_after <= 0:
            raise ValueError(f"idle time must be positive, got {idle_after}")
        self._card_of_path = dict(card_of_path)
        self._idle_after = idle_after
        self._above = active_above_percent
        self._cards = {path: CardActivity() for path in self._card_of_path}

    def observe(self, usage: UsageState, sample: UsageSample) -> dict[str, DeviceState]:
        """Apply one sample; the devices whose state changed, with their new state.

        A card missing from the sample (an NVML error for that card) counts as active: not
        knowing must never make a card look idle and get it lent away.
        """
        changed: dict[str, DeviceState] = {}
        for path, index in self._card_of_path.items():
            device = usage.device(path)
            card = sample.card(index)
            previous = self._cards[path]
            current = step(previous, held=bool(device and device.users),
                           active=card is None or is_active(card, self._above),
                           last_open=device.last_use if device else None, now=sample.time,
                           idle_after=self._idle_after)
            self._cards[path] = current
            if current.state is not previous.state:
                changed[path] = current.state
        return changed

    def idle_seconds(self, path: str, now: float) -> float:
        """How long the card has been without activity while held (0 when free or busy)."""
        card = self._cards.get(path)
        if card is None or card.state is not DeviceState.IDLE or card.last_active is None:
            return 0.0
        return max(0.0, now - card.last_active)
