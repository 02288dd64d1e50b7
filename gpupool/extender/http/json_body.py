"""A request body decoded as JSON only when its arrays and objects nest at most :data:`MAX_NESTING` deep.

Why: orjson before 3.9.15 (CVE-2024-27454; the project allowed 3.8) builds a document by recursing in
Rust with no bound, about 64 bytes of C stack per level, so 140,000 nested ``[`` and as many ``]``
(280 kB, far under the body cap) overflow the 8 MiB main thread and the extender dies with SIGSEGV;
later versions stop at 1,024 levels. Any other recursive walk of a document (a ``repr`` in a log
line, a deep copy) has the same kind of limit. The deepest field of a pod (a generic ephemeral
volume's selector values) lies about a dozen levels down in a request, so a small bound refuses only
hostile or broken bodies, with a 400 that says why, whatever orjson version is installed.

The depth is measured on the raw bytes before parsing, without recursion and in C or numpy loops:
escapes are dropped (``\\"`` is the only way a quote appears inside a string, and no escape opens
or closes anything), only quotes and brackets are kept, and a bracket counts when an even number
of quotes precedes it. A body with at most ``limit`` ``[`` and ``{`` bytes in all cannot nest
deeper and is not scanned. A filter of 5,000 names is scanned in about the time orjson parses it or
less (``bench/json_nesting.py``; docs/extender.md, "Limits and errors").
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson

MAX_NESTING = 64
"""Deepest nesting of arrays and objects read; a pod's deepest field is about a dozen levels down."""

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_NOT_A_MARK = bytes(b for b in range(256) if b not in b'"[]{}')
_BRACES_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
_QUOTE, _OPEN, _CLOSE = ord('"'), ord("["), ord("]")
_CHUNK = 1 << 18
"""Marks scanned per numpy pass: bounds the scan's memory (a few MiB) whatever the body's size."""


class UnreadableJsonError(ValueError):
    """The body is not JSON, or nests deeper than the bound (answered 400 with this message)."""


def load_json_body(raw: bytes | bytearray, limit: int = MAX_NESTING) -> Any:
    """The decoded body; :class:`UnreadableJsonError` for malformed JSON or nesting past ``limit``."""
    if nests_deeper_than(raw, limit):
        raise UnreadableJsonError(f"JSON nested deeper than {limit} arrays and objects")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UnreadableJsonError(f"malformed JSON: {exc}") from None


def nests_deeper_than(raw: bytes | bytearray, limit: int) -> bool:
    """Whether some point of ``raw`` lies inside more than ``limit`` arrays and objects.

    Exact for valid JSON. Malformed JSON (which orjson then refuses) may be judged either way.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    if b"\\" in raw:
        raw = _ESCAPE.sub(b"", raw)
    # Adjacent quotes delimit strings without brackets (or end one string and start the next): dropping
    # them changes no bracket's quote parity and leaves most bodies without a quote to count.
    marks = raw.translate(_BRACES_AS_BRACKETS, _NOT_A_MARK).replace(b'""', b"")
    depth, quotes = 0, 0  # the depth and the quote parity before the chunk
    for start in range(0, len(marks), _CHUNK):
        chunk = np.frombuffer(marks, dtype=np.uint8, count=min(_CHUNK, len(marks) - start), offset=start)
        is_quote = chunk == _QUOTE
        in_string = ((np.cumsum(is_quote, dtype=np.int32) + quotes) & 1).astype(bool)
        steps = (chunk == _OPEN).astype(np.int32) - (chunk == _CLOSE)
        steps[in_string] = 0
        levels = np.cumsum(steps, dtype=np.int32) + depth
        if int(levels.max()) > limit:
            return True
        depth, quotes = int(levels[-1]), (quotes + int(np.count_nonzero(is_quote))) & 1
    return False
