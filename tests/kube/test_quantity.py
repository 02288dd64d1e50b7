"""Kubernetes quantities: the apiserver's grammar and range, exactly; everything else refused quickly."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from gpupool.kube.quantity import MAX_QUANTITY, NANO, QuantityError, parse_quantity


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("500m", Decimal("0.5"), id="milli"),
        pytest.param("2", Decimal(2), id="plain"),
        pytest.param("16Gi", Decimal(16 * 1024**3), id="binary-suffix"),
        pytest.param("1e3", Decimal(1000), id="exponent"),
        pytest.param("1E", Decimal(10**18), id="exa-not-exponent"),
        pytest.param("1.5k", Decimal(1500), id="fraction-and-suffix"),
        pytest.param(".5", Decimal("0.5"), id="leading-dot"),
        pytest.param("5.", Decimal(5), id="trailing-dot"),
        pytest.param("+1", Decimal(1), id="plus-sign"),
        pytest.param("-1", Decimal(-1), id="negative-is-read-the-caller-refuses-it"),
        pytest.param("1Ei", Decimal(1024**6), id="largest-binary-suffix"),
        pytest.param(str(MAX_QUANTITY), Decimal(MAX_QUANTITY), id="largest-in-range"),
        pytest.param("0e99999999999", Decimal(0), id="zero-with-a-huge-exponent"),
        pytest.param("1e-999999999999", NANO, id="finer-than-nano-rounds-up"),
        pytest.param(12, Decimal(12), id="json-integer"),
        pytest.param(1.5, Decimal("1.5"), id="json-float"),
    ],
)
def test_valid_quantities(value: object, expected: Decimal) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        pytest.param("inf", "not a Kubernetes quantity", id="inf"),
        pytest.param("Infinity", "not a Kubernetes quantity", id="infinity"),
        pytest.param("NaN", "not a Kubernetes quantity", id="nan"),
        pytest.param("sNaN", "not a Kubernetes quantity", id="signalling-nan"),
        pytest.param("1_000", "not a Kubernetes quantity", id="underscore"),
        pytest.param(" 1", "not a Kubernetes quantity", id="space"),
        pytest.param("１", "not a Kubernetes quantity", id="full-width-digit"),
        pytest.param("1ki", "not a Kubernetes quantity", id="lower-case-binary-suffix"),
        pytest.param("", "not a Kubernetes quantity", id="empty"),
        pytest.param("9" * 3000, "3000 characters long", id="3000-digits"),
        pytest.param(str(MAX_QUANTITY + 1), "beyond the Kubernetes quantity range", id="just-past-the-range"),
        pytest.param("8Ei", "beyond the Kubernetes quantity range", id="binary-past-the-range"),
        pytest.param("1e999999999", "beyond the Kubernetes quantity range", id="billion-digit-exponent"),
        pytest.param(10**19, "beyond the Kubernetes quantity range", id="json-integer-past-the-range"),
        pytest.param(float("inf"), "not a finite number", id="float-inf"),
        pytest.param(float("nan"), "not a finite number", id="float-nan"),
        pytest.param(True, "got bool", id="boolean"),
        pytest.param(None, "got NoneType", id="null"),
        pytest.param({"a": 1}, "got dict", id="object"),
    ],
)
def test_invalid_quantities(value: object, fragment: str) -> None:
    with pytest.raises(QuantityError, match=fragment):
        parse_quantity(value)


def test_a_huge_exponent_is_refused_without_building_the_number() -> None:
    """``int(Decimal("1e999999999"))`` builds a billion-digit integer (minutes); refusing must not."""
    started = time.perf_counter()
    for _ in range(1000):
        with pytest.raises(QuantityError):
            parse_quantity("9e999999999")
    assert time.perf_counter() - started < 1.0
