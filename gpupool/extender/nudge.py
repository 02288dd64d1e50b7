"""A nudge: the small annotation patch that makes kube-scheduler retry a pending pod now.

Why: kube-scheduler parks a pod the extender refused until a cluster event it listens to comes, or
its own timer (five minutes in current releases) flushes it. Events it does not see (victims the
extender released, a GpuQuota raised, a loan offered) would leave the pod parked. An update of a
pending pod that changes more than its status moves it to the active queue at once; pods the
extender refused have no rejecting plugin of kube-scheduler's own, so nothing filters that move.

A nudge decides nothing: it books and frees no card. The retried filter and the bind's check under
the ledger lock decide as always, so a nudge too early, twice, or for a pod that fits no more costs
one scheduling cycle, never a double booking. Two users: :mod:`gpupool.extender.requeue`
(preemptors whose victims are gone) and :mod:`gpupool.extender.wakeup` (pods a change may now fit).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpupool.kube.podapi import ApiError, ConflictError, NotFoundError, PodApi

log = logging.getLogger(__name__)

Pending = Callable[[str], "str | None"]
"""The uid of pod ``namespace/name`` while the extender knows it as waiting (not bound, nothing
booked), else None."""

NUDGED, GONE, FAILED = "nudged", "gone", "failed"
"""How one nudge ended: patched; the pod no longer waits (bound, deleted, replaced); the API refused."""


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up (nudges are API writes: bounded)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.at = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def wait_s(self) -> float:
        """Seconds until the next token."""
        return max(0.0, (1.0 - self.tokens) / self.rate)


def still_waits(pod: Mapping[str, Any], uid: str) -> bool:
    """The API's copy is the same pod (uid), not bound and not being deleted."""
    meta = pod.get("metadata") or {}
    return meta.get("uid") == uid and not (pod.get("spec") or {}).get("nodeName") \
        and meta.get("deletionTimestamp") is None


def stamp(now: dt.datetime) -> str:
    """The time part of a nudge's value (a new value each time, so the patch is a change)."""
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def nudge_pod(api: PodApi, key: str, uid: str, annotation: str, value: str, *, conflict_retries: int = 3) -> str:
    """Patch ``annotation`` = ``value`` on pod ``key`` if it is still pod ``uid`` and still waits;
    returns :data:`NUDGED`, :data:`GONE` or :data:`FAILED`. A conflict (kube-scheduler wrote the
    pod's status meanwhile) is read again up to ``conflict_retries`` times."""
    namespace, _, name = key.partition("/")
    for _ in range(conflict_retries + 1):
        try:
            pod = api.get_pod(namespace, name)
            if not still_waits(pod, uid):
                return GONE
            version = str((pod.get("metadata") or {}).get("resourceVersion") or "")
            api.patch_pod_annotations(namespace, name, version, {annotation: value})
        except ConflictError:
            continue
        except NotFoundError:
            return GONE
        except ApiError as exc:
            log.warning("could not ask kube-scheduler to retry pod %s: %s", key, exc)
            return FAILED
        return NUDGED
    log.warning("could not ask kube-scheduler to retry pod %s: it kept changing", key)
    return FAILED
