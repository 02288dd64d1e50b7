"""Request bodies read under three caps: one body's size, the bytes all requests hold at once, and
how deep the JSON in a body nests.

Why: aiohttp's ``request.read()`` buffers a whole body before anything can refuse it, under a cap
far above one request's real size, so a few concurrent huge bodies can push the extender past its
pod's memory limit and stall ``/healthz`` while they are parsed (docs/extender.md, "Numbers behind
the code"). Here a body is read chunk by chunk and refused (413) as soon as it passes
``max_body_bytes`` (at once when its ``Content-Length`` says so), and a request that would push the
bytes held by all requests in flight past ``max_in_flight_bytes`` is turned away (503,
``Retry-After``) instead of queued. Memory for bodies is therefore bounded whatever the number of
connections, and the event loop never parses more than one capped body at a time.

The default cap (:data:`DEFAULT_MAX_BODY_BYTES`) is sized for the largest request kube-scheduler
sends with ``nodeCacheCapable: true``:

* filter/prioritize: 10,000 node names of the longest legal length (253 characters, plus quotes
  and a comma) take 10,000 x 256 B = 2.6 MB, beside the pod, which the apiserver caps at 3 MiB
  (its largest request body): 5.6 MB;
* preempt: meta victims of the candidate nodes (kube-scheduler's default: 10 % of the nodes, at
  least 100), 1,000 nodes x 110 pods x ~50 B per ``{"UID": ...}`` = 5.5 MB, plus the pod: 8.6 MB.

16 MiB covers both with room to spare. ``nodeCacheCapable: false`` sends whole Node objects
(~10 kB each, 50 MB for 5,000 nodes): raise ``--max-body-bytes`` for that mode.

The third cap is on what a body holds: it is decoded as JSON only when its arrays and objects nest
at most :data:`MAX_NESTING` deep (:func:`load_json_body`). Why: orjson before 3.9.15
(CVE-2024-27454; the project allowed 3.8 until it found this) builds a document by recursing in
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

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
from aiohttp import web

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body read (see the module doc for the sizing)."""

IN_FLIGHT_BODIES = 4
"""Bodies of the largest size that may be held at once; kube-scheduler sends one filter or
prioritize at a time and small binds beside it, so four leaves room for its retries."""


class BodyTooLargeError(Exception):
    """The body is larger than the cap (answered 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than {limit} bytes (the extender's --max-body-bytes)")


class BodiesBusyError(Exception):
    """Other requests hold the in-flight budget (answered 503 with ``Retry-After``)."""

    def __init__(self, budget: int) -> None:
        super().__init__(f"requests in flight already hold {budget} bytes of body; retry shortly")


class BodyReader:
    """Reads request bodies within a per-body cap and an in-flight budget shared by all requests.

    Single-threaded by design: it is used on the aiohttp event loop only, so the counter needs no lock.
    """

    def __init__(self, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
        self.max_body_bytes = max_body_bytes
        self.max_in_flight_bytes = IN_FLIGHT_BODIES * max_body_bytes
        self.in_flight_bytes = 0

    @contextlib.asynccontextmanager
    async def body(self, request: web.Request) -> AsyncIterator[bytearray]:
        """The whole body; its bytes count against the budget until the block ends (the handler
        that parses it runs inside, so its parsed document is bounded by the same budget)."""
        held = 0
        try:
            declared = request.content_length
            if declared is not None:
                if declared > self.max_body_bytes:
                    raise BodyTooLargeError(self.max_body_bytes)
                held = self._take(declared)
            data = bytearray()
            async for chunk in request.content.iter_any():
                if len(data) + len(chunk) > self.max_body_bytes:
                    raise BodyTooLargeError(self.max_body_bytes)
                if len(data) + len(chunk) > held:  # no or a lying Content-Length: take as it comes
                    held += self._take(len(data) + len(chunk) - held)
                data += chunk
            yield data
        finally:
            self.in_flight_bytes -= held

    def _take(self, size: int) -> int:
        if self.in_flight_bytes + size > self.max_in_flight_bytes:
            raise BodiesBusyError(self.max_in_flight_bytes)
        self.in_flight_bytes += size
        return size


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
