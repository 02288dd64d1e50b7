"""gpupool.kube.json_decode: orjson's speed, json's values."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpupool.kube.json_decode import loads

POD_EVENT = (b'{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"gpu-00001",'
             b'"namespace":"bench","uid":"5f0c8a52-1f4e-4b0e-9d3c-2a7e1c9b8d10","resourceVersion":"123456",'
             b'"annotations":{"gpupool.io/assignment-v1":"{\\"node\\":\\"node-00001\\"}"}},'
             b'"spec":{"nodeName":"node-00001","priority":0,"containers":[{"name":"main","resources":'
             b'{"limits":{"gpupool.io/gpu-core":"30"},"requests":{"cpu":"4","memory":"8Gi"}}}]},'
             b'"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}],"x":1.5e-3}}}')


@pytest.mark.parametrize("document", [
    POD_EVENT,
    POD_EVENT.decode(),
    b'{"a": 9223372036854775807, "b": -9223372036854775808}',  # 64-bit limits, 19 digits: json
    b'{"priority": 123456789012345678901234567890}',  # beyond 64 bits: orjson would give a float
    b'{"priority": -9223372036854775809}',
    b'{"a": 999999999999999999}',  # 18 digits: orjson, same int
    b'{"a": NaN, "b": Infinity, "c": 1e400}',  # json accepts these, orjson does not
    b'{"a": "\\ud800"}',  # a lone surrogate, escaped
    '{"a": "\ud800"}',  # and as a character of a str
    '{"a": "ü"}'.encode("utf-16"),  # not UTF-8
    b'{"a": 1, "a": 2}',
    b'[0.1, 1.7976931348623157e308, 5e-324, 2.2250738585072011e-308, 1E5, -0.0, 123456789012345678.5]',
    b'[]',
])
def test_same_values_and_types_as_json(document: bytes | str) -> None:
    ours, theirs = loads(document), json.loads(document)
    assert _typed(ours) == _typed(theirs)


def _typed(value: Any) -> Any:
    """The value with every leaf's type, so 1 and 1.0 (or a NaN, equal to nothing) tell apart."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return type(value).__name__, repr(value)


@pytest.mark.parametrize("broken", [b"", b"{", b'{"a": }', b"\xff"])
def test_a_broken_document_raises_what_json_raises(broken: bytes) -> None:
    with pytest.raises(ValueError) as ours:
        loads(broken)
    with pytest.raises(ValueError) as theirs:
        json.loads(broken)
    assert type(ours.value) is type(theirs.value)
