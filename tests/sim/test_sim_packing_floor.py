"""The offline packing bound of bench/packing_floor.py on instances whose optimum is known."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("scipy")


def _bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "packing_floor.py"
    spec = importlib.util.spec_from_file_location("packing_floor", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize(("counts", "cards"), [
    ({500: 4}, 2.0),                      # two halves per card
    ({600: 2, 400: 2}, 2.0),              # complements pair up
    ({810: 3}, 3.0),                      # nothing fits beside an 810
    ({810: 2, 190: 2}, 2.0),              # ... except a 190
    ({470: 3, 320: 3}, 2.5),              # LP relaxation: 1.5 cards of (470, 470) + one (320 x 3)
])
def test_cards_lower_bound(counts: dict[int, int], cards: float) -> None:
    assert _bench().cards_lower_bound(Counter(counts)) == pytest.approx(cards, abs=1e-6)
