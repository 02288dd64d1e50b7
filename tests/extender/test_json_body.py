"""The nesting bound on request bodies: the byte scan agrees with the depth of the decoded document,
whatever strings, escapes and white space the JSON holds, and a deep body is refused before parsing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.extender.http import body as json_body
from gpupool.extender.http.body import MAX_NESTING, UnreadableJsonError, load_json_body, nests_deeper_than

# Text rich in what could confuse a scan: brackets, quotes, backslashes and escapes of each.
tricky_text = st.text(st.sampled_from(list('[]{}"\\/ab\n\u00e9\u2028\U0001f600')), max_size=12)
leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), tricky_text)
document = st.recursive(leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(tricky_text, inner, max_size=3)), max_leaves=30)


def depth(value: Any) -> int:
    """The reference: arrays and objects around the deepest point of a decoded document."""
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


@given(doc=document, limit=st.integers(0, 12), ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 2]))
def test_the_scan_agrees_with_the_decoded_depth(doc: Any, limit: int, ascii_only: bool, indent: int | None) -> None:
    raw = json.dumps(doc, ensure_ascii=ascii_only, indent=indent).encode()
    assert nests_deeper_than(raw, limit) == (depth(doc) > limit)
    assert nests_deeper_than(bytearray(raw), limit) == (depth(doc) > limit)


@pytest.mark.parametrize(("raw", "deepest"), [
    (b'["[[[", "\\"[[", "\\\\", [["]"]]]', 3),  # an escaped quote does not end a string, an escaped \ does
    (b'{"a\\"{{": {"b": "\\\\\\"[["}}', 2),
    (b'[""""""[[]]]', 3),  # empty strings side by side
    (b'"[[[[[["', 0),
    (b"[]" * 100, 1),
])
def test_strings_and_escapes_do_not_count(raw: bytes, deepest: int) -> None:
    assert (nests_deeper_than(raw, deepest - 1), nests_deeper_than(raw, deepest)) == (True, False)


def test_a_deep_body_longer_than_one_scan_chunk_is_measured_across_chunks() -> None:
    """The depth and the quote parity carry from one numpy pass to the next."""
    chunk = json_body._CHUNK
    raw = b'["' + b"[" * chunk + b'",' + b"[" * (MAX_NESTING - 1) + b"1" + b"]" * MAX_NESTING
    assert not nests_deeper_than(raw, MAX_NESTING)
    assert nests_deeper_than(b"[" * chunk + raw + b"]" * chunk, MAX_NESTING)
    assert nests_deeper_than(b" " * (chunk - 3) + b"[" * (MAX_NESTING + 1), MAX_NESTING)


def test_load_refuses_past_the_bound_and_reads_at_it() -> None:
    at_bound = b"[" * MAX_NESTING + b"]" * MAX_NESTING
    assert depth(load_json_body(at_bound)) == MAX_NESTING
    with pytest.raises(UnreadableJsonError, match=r"^JSON nested deeper than 64 arrays and objects$"):
        load_json_body(b"[" + at_bound + b"]")
    with pytest.raises(UnreadableJsonError, match=r"^malformed JSON: "):
        load_json_body(b'{"Pod": ')
