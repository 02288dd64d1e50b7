"""Pacing the agent's PodResources calls to kubelet's rate limit, instead of learning it by refusals.

kubelet answers at most 100 PodResources calls a second with a burst of 10 (a token bucket in its
gRPC interceptor, ``pkg/kubelet/apis/podresources``: ``DefaultQPS``, ``DefaultBurstTokens``) and
refuses the rest with ``RESOURCE_EXHAUSTED``. The agent lists on every GetPreferredAllocation,
Allocate and PreStartContainer, so admitting a batch of GPU pods asks faster than that: each call
past the burst was refused and retried after 10, 20, 40 ... ms, and an Allocate waited for whichever
retry happened to find a token (`bench/allocate.py --pods 100`: p50 4 or 12 ms from one run to the
next, p99 40 or 77 ms, while the wall time, set by the limit, stayed 7.9 s).

The pacer keeps the same bucket on the agent's side and makes each call wait until kubelet's bucket
would have a token for it, so a call is sent once, when it can be answered, and waits at most the
calls queued before it. Waiting is a reservation (``golang.org/x/time/rate``'s Reserve): the bucket
may go below zero, each caller sleeping until its own token comes, so concurrent callers are served
in the order they asked. The mirror is only an estimate, as other clients (a monitoring agent
reading PodResources) draw from kubelet's bucket too: a refused call still backs off
(:meth:`CallPacer.refused` empties the mirror, so the calls after it wait for fresh tokens).

The mirror holds one token fewer than kubelet's bucket (:data:`PACED_BURST`). kubelet counts a
call when it arrives, the mirror when it is sent: a call that took longer to arrive than the next
one (a stalled event loop, a busy core) made the two arrive closer than a token apart, and kubelet
refused the second (one of 40 paced Lists under load). With a token to spare, kubelet has one for
such a call whenever the mirror had one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: kubelet's PodResources limit: ``podresources.DefaultQPS`` and ``DefaultBurstTokens`` (since 1.27).
KUBELET_PODRESOURCES_QPS = 100.0
KUBELET_PODRESOURCES_BURST = 10

#: The mirror's burst: kubelet's, less the token kept for calls that arrive late (above).
PACED_BURST = KUBELET_PODRESOURCES_BURST - 1


class CallPacer:
    """A token bucket of ``rate`` calls a second holding at most ``burst``, served by reservation."""

    def __init__(self, rate: float = KUBELET_PODRESOURCES_QPS, burst: int = PACED_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a pacer needs a positive rate and a burst of at least 1 (got {rate}, {burst})")
        self.rate, self.burst, self.clock = rate, burst, clock
        self._tokens = float(burst)
        self._at = clock()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now

    def reserve(self) -> float:
        """Take the next token and return how long to wait (seconds) before using it."""
        self._refill()
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def refused(self) -> None:
        """kubelet refused a call: its bucket is empty whatever the mirror thought."""
        self._refill()
        self._tokens = min(self._tokens, 0.0)
