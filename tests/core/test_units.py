"""Units: the API's compute percent becomes core per-mille, or a precise error."""

from __future__ import annotations

import pytest

from gpupool.core.units import COMPUTE_PER_CARD, MEMORY_UNIT_MIB, percent_to_compute


def test_constants() -> None:
    assert COMPUTE_PER_CARD == 1000
    assert MEMORY_UNIT_MIB == 256


@pytest.mark.parametrize(("percent", "milli"), [(0, 0), (1, 10), (25, 250), (30, 300), (100, 1000)])
def test_percent_to_compute(percent: int, milli: int) -> None:
    assert percent_to_compute(percent) == milli


@pytest.mark.parametrize("percent", [-1, 101, 1000])
def test_percent_to_compute_rejects_out_of_range(percent: int) -> None:
    with pytest.raises(ValueError, match=r"percentage of one card \(0\.\.100\)"):
        percent_to_compute(percent)

