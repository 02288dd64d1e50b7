"""Fence a predecessor's late binds: a new leader changes every waiting GPU pod before it binds.

Why: the hand-over's timeline (docs/extender.md, "High availability") has the old leader's
assignment writes over before anyone may take the Lease, because each write is given up after the
commit timeout. That holds for a leader that dies, not for one cut from the apiserver by a
partition: a Binding it sent just before stepping down can sit in the network and reach the
apiserver after the new leader took over, with cards the new leader has since given away. The
Binding carries the resourceVersion the old leader read as a precondition (honoured from v1.23),
so it fails for a pod that changed since; this module makes sure every such pod has changed.

Right after acquiring the Lease, before its catch-up list and before its term admits any bind, the
new leader lists the pods bound to no node (a quorum list) and patches an annotation on each GPU pod
among them, with the listed resourceVersion as the patch's own precondition:

* patched: the pod has a new resourceVersion, so a Binding read before it is refused (409);
* 409: the pod changed after the list, which fences it just as well;
* 404: the pod is gone;
* any other failure (a timeout included): the fence is not known to hold, so it raises and the
  hand-over tries the whole catch-up again; the term stays closed.

A late Binding either landed before the fence's patch, then the catch-up list that follows holds
it, or after, then it is refused. Pods created after the list cannot carry an old leader's bind:
its term ended before this one began, and it read every pod it bound before that. The patch also
moves the pod to kube-scheduler's active queue (an update beyond its status), so pods parked in
backoff during the leaderless seconds are tried at once. Costs one list of waiting pods and one
PATCH per waiting GPU pod, per term.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpupool.extender.nudge import stamp
from gpupool.extender.request_memo import RequestMemo
from gpupool.kube.podapi import ApiError, ConflictError, NotFoundError, PodApi
from gpupool.kube.translate import TranslationError

log = logging.getLogger(__name__)

FENCED, CHANGED, GONE, FAILED = "fenced", "changed", "gone", "failed"
"""How one pod's fence ended: patched; changed since the list (fenced already); deleted; not known."""


def wants_gpu(requests: RequestMemo) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a pod asks for a resource gpupool binds with an assignment (the cache's translation);
    a pod gpupool cannot read gets no assignment from any leader, so it needs no fence."""
    def check(pod: Mapping[str, Any]) -> bool:
        try:
            return requests.request(pod).wants_gpu
        except TranslationError:
            return False
    return check


class FenceFailed(RuntimeError):
    """Some waiting GPU pods could not be fenced: the term must not bind yet."""


class TakeoverFence:
    """Called by the hand-over with the new term, before its catch-up list (see the module doc)."""

    def __init__(self, api: PodApi, list_waiting: Callable[[], list[dict[str, Any]]],
                 is_gpu_pod: Callable[[Mapping[str, Any]], bool], identity: str, domain: str, *,
                 workers: int = 8, now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.api = api
        self.list_waiting = list_waiting
        self.is_gpu_pod = is_gpu_pod
        self.identity = identity
        self.annotation = f"{domain}/leader-term"
        """Pod annotation: the leader term that fenced the pod (its change is the fence)."""
        self.workers = workers
        self.now = now
        self.last: Counter[str] = Counter()
        """Outcomes of the last fence, for the log and tests."""

    def __call__(self, term: int) -> None:
        started = time.monotonic()
        pods = [p for p in self.list_waiting() if self.is_gpu_pod(p)]
        value = f"{self.identity} term {term} {stamp(self.now())}"  # new each time: the patch is a change
        if pods:
            with ThreadPoolExecutor(min(self.workers, len(pods)), thread_name_prefix="gpupool-fence") as pool:
                outcomes = list(pool.map(lambda pod: self._fence(pod, value), pods))
        else:
            outcomes = []
        self.last = Counter(outcomes)
        if self.last[FAILED]:
            raise FenceFailed(f"{self.last[FAILED]} of {len(pods)} waiting GPU pods could not be fenced "
                              "against the previous leader's late binds")
        log.info("term %d: fenced %d waiting GPU pods against the previous leader's late binds in %.2f s (%s)",
                 term, len(pods), time.monotonic() - started, dict(self.last))

    def _fence(self, pod: Mapping[str, Any], value: str) -> str:
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        try:
            self.api.patch_pod_annotations(namespace, name, str(meta.get("resourceVersion") or ""),
                                           {self.annotation: value})
        except ConflictError:
            return CHANGED
        except NotFoundError:
            return GONE
        except ApiError as exc:
            log.warning("fencing pod %s/%s against the previous leader's late binds: %s", namespace, name, exc)
            return FAILED
        return FENCED
