"""Request bodies read under two caps: one body's size, and the bytes all requests hold at once.

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
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

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
