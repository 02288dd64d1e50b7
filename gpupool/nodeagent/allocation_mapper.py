"""Which pod and container an Allocate call is for, from kubelet's own record of admission.

Allocate carries only device IDs. The mapper answers "whose call is this?" from facts kubelet 1.35
and 1.37 guarantee (file and function names, and what changed since 1.20, in
docs/allocate-mapping.md):

* G1 admission is serial per node: ``HandlePodAdditions`` adds a pod to the pod manager, then runs
  its admission (which calls Allocate) before it touches the next pod; an in-place resize never
  calls Allocate, and a restart re-admits checkpointed containers without calling it;
* G2 within a pod, Allocate runs for init containers (native sidecars included) then app
  containers in spec order, one container after the other, one synchronous call per (container,
  resource); a container's devices are recorded once its call returned;
* G3 PodResources ``List`` shows every active pod of the pod manager (the pod being admitted
  included, a rejected one no longer), and for each native sidecar and app container the device
  IDs recorded for it.

So at an Allocate for resource R, the pod being admitted is listed in PodResources and still has a
container that wants R and has not been served; a container is served once the agent answered it,
``allocated-v1`` names it, PodResources shows its R devices, or PodResources shows devices for a
container after it in admission order (G2: kubelet finished every earlier one first). Every other
listed pod either finished admission or never calls Allocate again. Among several candidate pods
the one that appeared in PodResources most recently is the one being admitted (G1). Only pods that
appeared in the same snapshot can tie; the tie is broken by progress, creation time (kubelet sorts
each batch by it), and finally by equivalence: containers with the same request signature are
interchangeable for every per-card total, and reconciliation records what each really got.

The mapper is pure bookkeeping: no I/O, no locks. It is driven from one asyncio loop, and kubelet
never has two Allocate calls of one node in flight (G1), so no per-node lock is needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpupool.core.model import CardSlice, ContainerAssignment
from gpupool.nodeagent.types import ContainerView, PodResourcesSnapshot, PodView

PodKey = tuple[str, str]


class MappingError(LookupError):
    """No pod on this node is waiting for this Allocate; the message lists what was considered."""


@dataclass(frozen=True)
class Resolution:
    """The (pod, container) an Allocate call belongs to, and on what ground it was chosen.

    ``basis``: ``unique`` (one candidate), ``newest`` (the most recently admitted pod), ``progress``
    (the only tied pod already mid-admission), ``created`` (latest creation time among pods first
    seen together), ``equivalent`` (tied pods with identical request signatures), ``ambiguous``.
    """

    pod: PodView
    container: ContainerView
    assignment: ContainerAssignment
    basis: str
    candidates: int


@dataclass(frozen=True)
class ServedRecord:
    """One Allocate answered: to whom, with what, for which device IDs."""

    pod_key: PodKey
    uid: str
    container: str
    init: bool
    resource: str
    device_ids: frozenset[str]
    slices: tuple[CardSlice, ...]
    uuids: tuple[str, ...]
    basis: str
    at: float
    sidecar: bool = False
    """A native sidecar (init container with ``restartPolicy: Always``): PodResources lists it."""

    @property
    def listed(self) -> bool:
        """Whether PodResources lists the served container (app containers and native sidecars)."""
        return not self.init or self.sidecar


@dataclass(frozen=True)
class Mismatch:
    """kubelet recorded ``record.device_ids`` under a different container than the one served."""

    record: ServedRecord
    holder: PodKey
    holder_container: str


def signature(container: ContainerView, assignment: ContainerAssignment) -> tuple[object, ...]:
    """What makes two containers interchangeable: same limits and same slice shapes (not cards)."""
    shapes = tuple((s.memory_mib, s.compute, s.exclusive) for s in assignment.slices)
    return (tuple(sorted(container.limits.items())), container.init, shapes)


class AllocationMapper:
    """Resolves Allocate calls to containers and keeps the served log for reconciliation."""

    def __init__(self, node: str, clock: Callable[[], float] = time.monotonic,
                 forget_after_s: float = 60.0) -> None:
        self.node = node
        self._clock = clock
        self._forget_after = forget_after_s
        self._seq = 0
        self._first_seen: dict[tuple[str, str, str], int] = {}
        self._served: dict[tuple[str, str, str], ServedRecord] = {}
        self._pods_served: dict[str, int] = {}
        self._gone_since: dict[PodKey, float] = {}

    # ------------------------------------------------------------------------------- observing
    def observe(self, snapshot: PodResourcesSnapshot, pods: Mapping[PodKey, PodView]) -> None:
        """Record a PodResources answer: which pods kubelet holds now, and since when."""
        self._seq += 1
        now = self._clock()
        for key in snapshot:
            pod = pods.get(key)
            if pod is not None:
                self._first_seen.setdefault((pod.namespace, pod.name, pod.uid), self._seq)
            self._gone_since.pop(key, None)
        for rec in list(self._served.values()):
            if rec.pod_key not in snapshot:
                since = self._gone_since.setdefault(rec.pod_key, now)
                if now - since > self._forget_after:
                    self._forget(rec.uid, rec.pod_key)

    def _forget(self, uid: str, key: PodKey) -> None:
        for k in [k for k in self._served if k[0] == uid]:
            del self._served[k]
        self._pods_served.pop(uid, None)
        self._gone_since.pop(key, None)
        for k in [k for k in self._first_seen if k[2] == uid]:
            del self._first_seen[k]

    # ------------------------------------------------------------------------------ resolving
    def next_container(self, pod: PodView, resource: str,
                       snapshot: PodResourcesSnapshot) -> ContainerView | None:
        """The container of ``pod`` whose Allocate for ``resource`` comes next, if any (G2)."""
        recorded = snapshot.get(pod.key, {})
        order = pod.admission_order()
        # kubelet allocates one container after the other in this order and records a container's
        # devices only once its call returned (G2): devices recorded for a container (a native
        # sidecar or an app container: G3) mean every container before it is done.
        done_before = max((i for i, c in enumerate(order)
                           if any(ids for ids in recorded.get(c.name, {}).values())), default=-1)
        for i, c in enumerate(order):
            if c.limits.get(resource, 0) <= 0 or (pod.uid, c.name, resource) in self._served:
                continue
            if resource in pod.allocated.get(c.name, frozenset()):
                continue
            if i < done_before or recorded.get(c.name, {}).get(resource):
                continue
            return c
        return None

    def resolve(self, resource: str, size: int, snapshot: PodResourcesSnapshot,
                pods: Mapping[PodKey, PodView], device_ids: frozenset[str] = frozenset(),
                card_of: Callable[[str], int | None] = lambda _: None) -> Resolution:
        """The container this Allocate (``size`` devices of ``resource``) belongs to."""
        candidates: list[tuple[PodView, ContainerView, ContainerAssignment]] = []
        notes: list[str] = []
        for key in snapshot:
            pod = pods.get(key)
            if pod is None or pod.terminated:
                continue
            container = self.next_container(pod, resource, snapshot)
            if container is None:
                continue
            if container.limits[resource] != size:
                notes.append(f"{key[0]}/{key[1]}/{container.name} wants {container.limits[resource]}")
                continue
            if pod.assignment is None:
                notes.append(f"{key[0]}/{key[1]} has no readable assignment {pod.assignment_error}".strip())
                continue
            assignment = pod.assignment.container(container.name)
            if assignment is None or (pod.assignment.placement.node not in ("", self.node)):
                notes.append(f"{key[0]}/{key[1]}/{container.name} is not assigned cards on {self.node}")
                continue
            candidates.append((pod, container, assignment))
        if not candidates:
            detail = "; ".join(notes) or "no listed pod waits for it"
            raise MappingError(f"Allocate of {size} x {resource}: no container on node {self.node} "
                               f"matches ({detail})")
        n = len(candidates)
        if n == 1:
            return Resolution(*candidates[0], basis="unique", candidates=1)
        def seen(pod: PodView) -> int:
            return self._first_seen.get((pod.namespace, pod.name, pod.uid), 0)

        newest = max(seen(p) for p, _, _ in candidates)
        tied = [c for c in candidates if seen(c[0]) == newest]
        if len(tied) == 1:
            return Resolution(*tied[0], basis="newest", candidates=n)
        started = [c for c in tied if self._pods_served.get(c[0].uid)]
        if len(started) == 1:
            return Resolution(*started[0], basis="progress", candidates=n)
        latest = max(c[0].created for c in tied)
        tied = [c for c in tied if c[0].created == latest]
        if len(tied) == 1:
            return Resolution(*tied[0], basis="created", candidates=n)
        equivalent = len({signature(c, a) for _, c, a in tied}) == 1
        cards = [card_of(d) for d in device_ids]

        def overlap(entry: tuple[PodView, ContainerView, ContainerAssignment]) -> tuple[int, str, str]:
            mine = set(entry[2].cards)
            return (-sum(1 for c in cards if c in mine), entry[0].namespace, entry[0].name)

        best = min(tied, key=overlap)
        return Resolution(*best, basis="equivalent" if equivalent else "ambiguous", candidates=n)

    def record(self, resolution: Resolution, resource: str, device_ids: frozenset[str],
               uuids: tuple[str, ...]) -> ServedRecord:
        """Log an answered Allocate; the container now counts as served for ``resource``."""
        pod, container = resolution.pod, resolution.container
        rec = ServedRecord(pod.key, pod.uid, container.name, container.init, resource, device_ids,
                           resolution.assignment.slices, uuids, resolution.basis, self._clock(),
                           sidecar=container.restartable)
        self._served[(pod.uid, container.name, resource)] = rec
        self._pods_served[pod.uid] = self._pods_served.get(pod.uid, 0) + 1
        return rec

    # --------------------------------------------------------------------------- reconciling
    def served(self) -> list[ServedRecord]:
        """Every record still kept (pods kubelet still lists, or recently gone)."""
        return list(self._served.values())

    def find(self, resource: str, device_ids: frozenset[str]) -> ServedRecord | None:
        """The record of the Allocate that served exactly these device IDs (app or init)."""
        for rec in self._served.values():
            if rec.resource == resource and rec.device_ids == device_ids:
                return rec
        return None

    def mismatches(self, snapshot: PodResourcesSnapshot) -> list[Mismatch]:
        """Listed containers (app containers, native sidecars) whose device IDs kubelet recorded
        under a container we did not serve.

        Device IDs are exclusive among active pods (kubelet removes them from the free pool until the
        pod terminates) and a listed container's IDs are never reused by another container (only a
        regular init container's are, by later containers of its pod), so the holder of a served
        set in PodResources is exactly who got the grant.
        """
        holders: dict[tuple[str, frozenset[str]], tuple[PodKey, str]] = {}
        for key, containers in snapshot.items():
            for cname, resources in containers.items():
                for res, ids in resources.items():
                    holders[(res, ids)] = (key, cname)
        out = []
        for rec in self._served.values():
            if not rec.listed or not rec.device_ids:
                continue
            holder = holders.get((rec.resource, rec.device_ids))
            if holder is not None and holder != (rec.pod_key, rec.container):
                out.append(Mismatch(rec, holder[0], holder[1]))
        return out
