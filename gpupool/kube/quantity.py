"""Kubernetes quantities (``500m``, ``16Gi``, ``1e3``, ``2``) read exactly as the apiserver reads them.

Why not ``kubernetes.utils.parse_quantity``: it hands the text to :class:`decimal.Decimal`, which
also reads ``inf``, ``NaN``, ``1_000``, `` 1`` and full-width digits, and keeps ``1e999999999``
exact, so the first ``int()`` of it builds a billion-digit number (minutes of CPU, gigabytes).
A request carrying such a value reached the extender's handlers as an ``OverflowError`` or a
``decimal.InvalidOperation`` (a 500) or stalled it. Here the text must follow the apiserver's
grammar, is at most :data:`MAX_QUANTITY_CHARS` long, and its value lies within the apiserver's
range (:data:`MAX_QUANTITY`), so every later conversion to an integer is cheap and exact.
"""

from __future__ import annotations

import math
import re
from decimal import Context, Decimal

MAX_QUANTITY = (1 << 63) - 1
"""The apiserver's bound: "no quantity may represent a number greater than 2^63-1 in magnitude"."""

MAX_QUANTITY_CHARS = 64
"""Longest quantity text read. The longest in-range quantity written with three decimals and a
suffix is 26 characters; the room above keeps odd but valid spellings (leading zeros) readable."""

#: ``<sign><digits>[.<digits>]<suffix>``: the grammar of k8s.io/apimachinery's resource.Quantity.
_GRAMMAR = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?")
_NANO_EXPONENT = -9
NANO = Decimal(1).scaleb(_NANO_EXPONENT)
"""The smallest quantity the apiserver keeps: finer values are rounded up to it."""
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_EXACT = Context(prec=200)
"""Precision for the exact product of a mantissa of at most 64 digits and a suffix's factor."""
_LARGEST_DIGITS = len(str(MAX_QUANTITY))
"""A value whose leading digit stands further left than this is out of range (decided from the
mantissa's exponent, without building the number)."""


class QuantityError(ValueError):
    """Not a Kubernetes quantity, or outside the apiserver's range; the message says which."""


def parse_quantity(value: object) -> Decimal:
    """The exact value of a quantity given as text or as a JSON number."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityError(f"expected a quantity string or number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise QuantityError("is not a finite number")
    if isinstance(value, int):
        return _in_range(Decimal(value))
    text = repr(value) if isinstance(value, float) else value
    if len(text) > MAX_QUANTITY_CHARS:
        raise QuantityError(f"is {len(text)} characters long; a Kubernetes quantity is at most "
                            f"{MAX_QUANTITY_CHARS} here")
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        raise QuantityError("is not a Kubernetes quantity (e.g. 500m, 2, 16Gi, 1e3)")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return _in_range(_EXACT.multiply(number, Decimal(1024) ** _BINARY[suffix]))
    exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:] or 0)
    if number.is_zero():
        return Decimal(0)
    if number.adjusted() + exponent >= _LARGEST_DIGITS:
        raise QuantityError(f"is beyond the Kubernetes quantity range (±{MAX_QUANTITY})")
    if number.adjusted() + exponent < _NANO_EXPONENT:  # the apiserver rounds these up to 1n
        return NANO.copy_sign(number)
    return _in_range(number.scaleb(exponent, _EXACT))


def _in_range(number: Decimal) -> Decimal:
    if abs(number) > MAX_QUANTITY:
        raise QuantityError(f"is beyond the Kubernetes quantity range (±{MAX_QUANTITY})")
    return number
