"""Units: the API's percent and memory quantities become core integers, or a precise error."""

from __future__ import annotations

import pytest

from gpupool.core.units import COMPUTE_PER_CARD, MEMORY_UNIT_MIB, parse_memory_mib, percent_to_compute


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


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        (0, 0),
        (4096, 4096),
        ("4096", 4096),
        ("4096Mi", 4096),
        ("  512Mi ", 512),
        ("16Gi", 16 * 1024),
        ("1Ti", 1024 * 1024),
        ("16u", 16 * 256),
        ("1u", 256),
        ("0u", 0),
    ],
)
def test_parse_memory_mib(text: str | int, mib: int) -> None:
    assert parse_memory_mib(text) == mib


@pytest.mark.parametrize("text", ["", "Gi", "1.5Gi", "-1", "4096MB", "16G", "16 Gi", "abc", "12Ki", "u16"])
def test_parse_memory_mib_rejects_unreadable_text(text: str) -> None:
    with pytest.raises(ValueError, match="cannot read memory quantity"):
        parse_memory_mib(text)


def test_parse_memory_mib_error_names_the_text_and_the_units() -> None:
    with pytest.raises(ValueError) as info:
        parse_memory_mib("3GB")
    assert "'3GB'" in str(info.value)
    assert "256 MiB units" in str(info.value)


def test_parse_memory_mib_rejects_negative_integers() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        parse_memory_mib(-1)
