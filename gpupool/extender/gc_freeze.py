"""Keep Python's cyclic garbage collector off the extender's long-lived cache.

Why: the watch cache of a large cluster is hundreds of thousands of objects (node specs, pod
records, bookings) that live for the whole process. Every full (generation 2) collection walks all
of them, a pause many times a filter call's length that lands inside whatever filter or
prioritize call is running and alone breaks the latency target. ``gc.freeze()`` moves the objects
alive now to a permanent generation that collections skip (they are still freed by reference
counting when dropped), which shortens those pauses by an order of magnitude (docs/extender.md,
"Latency and throughput work").

Collect first, so that garbage cycles are freed rather than frozen, and repeat now and then
(the cache keeps growing with new pods): each call then only walks what is younger than the last.
"""

from __future__ import annotations

import gc


def freeze_long_lived() -> int:
    """Collect garbage, then exempt every surviving object from future collections.

    Returns how many objects are frozen in total.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
