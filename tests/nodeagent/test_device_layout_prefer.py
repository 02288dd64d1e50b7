"""GetPreferredAllocation's choice (:meth:`DeviceLayout.prefer`): the must-include IDs, then the
assigned cards' free IDs round-robin in numeric order, then any free ID; and its cost, which kubelet's
admission waits for: each card's IDs are sorted out by their head, parsed once per card."""

from __future__ import annotations

import random

import pytest

from gpupool.api.names import ResourceNames
from gpupool.nodeagent.device_layout import DeviceLayout

NAMES = ResourceNames()
LAYOUT = DeviceLayout(NAMES)


def by_hand(available: list[str], must_include: list[str], size: int, cards: list[int]) -> list[str]:
    """The rule written out plainly (card_of and a numeric tail for every ID)."""
    def key(device_id: str) -> tuple[int, int, str]:
        card = DeviceLayout.card_of(device_id)
        tail = device_id.rsplit("-", 1)[-1][1:] if "-" in device_id else "0"
        return (card if card is not None else 1 << 30, int(tail) if tail.isdigit() else 0, device_id)

    chosen = list(dict.fromkeys(must_include))[:size]
    free = [d for d in available if d not in chosen]
    queues = [sorted((d for d in free if DeviceLayout.card_of(d) == c), key=key) for c in cards]
    queues = [q for q in queues if q]
    while len(chosen) < size and queues:
        for q in list(queues):
            if len(chosen) < size:
                chosen.append(q.pop(0))
            if not q:
                queues.remove(q)
    picked = set(chosen)
    return chosen + sorted((d for d in free if d not in picked and DeviceLayout.card_of(d) not in cards),
                           key=key)[: size - len(chosen)]


@pytest.mark.parametrize("seed", range(20))
def test_prefer_chooses_as_the_rule_says(seed: int) -> None:
    rng = random.Random(seed)
    ids = [i for card in range(6) for i in LAYOUT.card_ids(NAMES.gpu_mem, card, 4096)]
    ids += ["g03-m7", "g1", "x-1", "-g2", "g", "gx-m1"]  # heads that are not a layout's own
    available = rng.sample(ids, rng.randint(0, len(ids)))
    must = rng.sample(available, rng.randint(0, 2))
    cards = rng.sample(range(7), rng.randint(0, 3))
    size = rng.randint(1, 40)
    assert LAYOUT.prefer(available, must, size, cards) == by_hand(available, must, size, cards)


def test_prefer_parses_the_card_of_each_head_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 cards of 48 GiB offer 3,072 memory IDs: their cards are read from 16 heads, not 3,072 IDs."""
    ids = [i for card in range(16) for i in LAYOUT.card_ids(NAMES.gpu_mem, card, 49152)]
    parsed: list[str] = []
    card_of = DeviceLayout.card_of

    def counting(device_id: str) -> int | None:
        parsed.append(device_id)
        return card_of(device_id)

    monkeypatch.setattr(DeviceLayout, "card_of", staticmethod(counting))
    chosen = LAYOUT.prefer(ids, [], 8, [3, 9])
    assert chosen[:2] == ["g3-m0", "g9-m0"] and len(chosen) == 8
    assert len(parsed) <= 16 + len(chosen) * 2  # the heads, and at most the sorting of what is chosen
