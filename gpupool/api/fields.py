"""Readers of one field of a decoded JSON document, each refusing a bad value with the field named.

The annotation codecs (:mod:`gpupool.api.annotations`) read every field through these, so the type,
sign, upper bound and text rules are written once and every document applies them alike.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from gpupool.api.limits import text_problem

SCHEMA_VERSION = 1


class AnnotationError(ValueError):
    """An annotation value that does not follow its schema; the message names the field."""


def load_document(text: str, what: str) -> dict[str, Any]:
    """Parse ``text`` as a JSON object of schema version 1.

    Deeply nested arrays (an annotation may hold 256 KiB of ``[``) exhaust the parser's recursion
    and integers of thousands of digits exceed Python's conversion limit; both are refused here
    like any other malformed text instead of escaping as a ``RecursionError``.
    """
    try:
        doc = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise AnnotationError(f"{what}: not valid JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(doc, dict):
        raise AnnotationError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    version = doc.get("v")
    if version != SCHEMA_VERSION:
        raise AnnotationError(f"{what}: unsupported schema version {shown(version)} (this build reads v1)")
    return doc


def field(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``doc[key]``, which must be of ``kind`` (a boolean is never taken for a number)."""
    if key not in doc:
        raise AnnotationError(f"{where}: missing field {key!r}")
    value = doc[key]
    if isinstance(value, bool) and kind is not bool:
        raise AnnotationError(f"{where}.{key}: expected {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise AnnotationError(f"{where}.{key}: expected {_kind_name(kind)}, got {type(value).__name__}")
    return value


def bounded(doc: Mapping[str, Any], key: str, where: str, maximum: int, unit: str = "") -> int:
    """An integer field within ``0..maximum``."""
    value: int = field(doc, key, int, where)
    check_bounded(value, f"{where}.{key}", maximum, unit)
    return value


def check_bounded(value: int, where: str, maximum: int, unit: str = "") -> None:
    """Refuse ``value`` outside ``0..maximum`` (``where`` names the field)."""
    if value < 0:
        raise AnnotationError(f"{where}: must be non-negative, got {shown(value)}")
    if value > maximum:
        suffix = f" {unit}" if unit else ""
        raise AnnotationError(f"{where}: at most {maximum}{suffix}, got {shown(value)}")


def text(doc: Mapping[str, Any], key: str, where: str) -> str:
    """A string field that is a usable name (:func:`gpupool.api.limits.text_problem`)."""
    value: str = field(doc, key, str, where)
    check_text(value, f"{where}.{key}")
    return value


def check_text(value: str, where: str) -> None:
    """Refuse a name that is empty, too long or holds control characters."""
    problem = text_problem(value)
    if problem is not None:
        raise AnnotationError(f"{where}: {problem}")


def shown(value: object) -> str:
    """``repr`` of a refused value for an error message, cut short: a refused value may be a
    4,000-digit number or a megabyte of text, and ``repr`` refuses integers past 4,300 digits."""
    if isinstance(value, int) and value.bit_length() > 128:  # repr() refuses over 4,300 digits
        return f"a {value.bit_length()}-bit integer"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:24]}...({len(text)} characters)"


def format_time(when: dt.datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, as Kubernetes writes times."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str, where: str) -> dt.datetime:
    """Read an RFC 3339 time; naive times are taken as UTC."""
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise AnnotationError(f"{where}: {value[:64]!r} is not an RFC 3339 time") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__
