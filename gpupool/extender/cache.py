"""The extender's in-memory view of the cluster: nodes, pods, and the core ledger built from them.

Why a separate cache (not a read of the API per request): filter and prioritize must answer for
thousands of nodes within milliseconds, so they read a :class:`ClusterState` that is kept current by
list+watch events (:mod:`gpupool.extender.watch`) and by the binder's own reservations.

The ledger books what every pod holds: its cards, and its CPU and memory on the node it is bound
to, pods without GPUs included, so the policies' CPU terms see the node as the simulator would.
This module turns API objects into pod records (:mod:`gpupool.extender.pod_records`) and node
specs (:mod:`gpupool.extender.node_specs`); how a pod's booking evolves (assumed by a filter,
reserved by a bind, pinned after it, annotated, bound, confirmed, expired, released, rolled back) is the table of
:mod:`gpupool.extender.bookings`, and :mod:`gpupool.extender.booking_keeper` keeps the ledger equal
to what the stages hold, conflicts included (:mod:`gpupool.extender.booking_problems`).

Thread safety: every public method takes :attr:`lock`; callers that read ``state`` for several steps
(filter, prioritize, bind) hold it themselves.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpupool.api.annotations import Assignment
from gpupool.api.cluster_settings import CONFIG_MAP, ClusterSettings
from gpupool.api.dra import driver_name
from gpupool.api.names import ResourceNames
from gpupool.api.settings_check import settings_problem
from gpupool.api.tenancy import TenancyNames
from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import NodeSpec, Placement, PodRequest
from gpupool.core.policies import DEFAULT_POLICY, PlacementPolicy, make_policy
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import ClusterState
from gpupool.extender.booking_keeper import BookingKeeper
from gpupool.extender.booking_problems import BookingProblems
from gpupool.extender.bookings import Booking, Notice
from gpupool.extender.borrowing import BorrowSettings, Lending
from gpupool.extender.dra_bookings import ClaimBookings
from gpupool.extender.lendable import LendingNames, NodeLoans, is_borrower
from gpupool.extender.node_specs import NodeSpecs, has_soft_taint, node_name, served_aliases
from gpupool.extender.pod_records import read_pod
from gpupool.extender.request_memo import RequestMemo
from gpupool.extender.status_updates import carried_over, listed_key
from gpupool.extender.victims import Holder
from gpupool.kube.node_enforcement import share_refusal
from gpupool.kube.pod_holding import PodRecord
from gpupool.kube.tenancy import PodTenancy
from gpupool.kube.tenancy_book import TenancyBook
from gpupool.kube.tenancy_layers import Admission, Admissions
from gpupool.kube.translate import TranslationError, as_dict, pod_key

log = logging.getLogger(__name__)


class ClusterCache:
    """Nodes and pods from the API, folded into one :class:`ClusterState` and a :class:`Scheduler`."""

    def __init__(self, names: ResourceNames | None = None, *, policy: str = DEFAULT_POLICY,
                 unconfirmed_timeout_s: float = 300.0, clock: Callable[[], float] = time.time,
                 tenancy_required: bool = False, borrow: BorrowSettings | None = None,
                 settings: ClusterSettings | None = None, settings_source: str = CONFIG_MAP) -> None:
        self.names = names or ResourceNames()
        self.settings = settings or ClusterSettings.reading(self.names, (borrow or BorrowSettings()).threshold)
        """What every node's agent must run with; a node whose agent published other values gets no
        GPU pod, with the reason in :attr:`node_problems` (docs/cluster-config.md)."""
        self.settings_source = settings_source
        """The ConfigMap (``namespace/name``) the reasons tell the admin to set the values in."""
        self.policy_name = policy
        self.unconfirmed_timeout_s = unconfirmed_timeout_s
        self.clock = clock
        self.lock = threading.RLock()
        self.state = ClusterState()
        self.profile: WorkloadProfile | None = None
        self.scheduler = Scheduler(self.state, make_policy(policy))  # fails fast on an unknown name
        self.pods: dict[str, PodRecord] = {}
        self.uids: dict[str, str] = {}
        self.release_listeners: list[Callable[[str], None]] = []
        """Told the key of every pod whose end released its booking (every bound pod has one), under
        :attr:`lock`; they must not block (:mod:`gpupool.extender.requeue`)."""
        self.keeper = BookingKeeper(self.state, self.pods, clock=clock, unconfirmed_timeout_s=unconfirmed_timeout_s,
                                    on_release=self._announce_release)
        self.claims = ClaimBookings(self.state, self.keeper, driver_name(self.names.domain))
        """DRA claims of gpupool's driver, booked in the same ledger (:mod:`gpupool.extender.dra_bookings`)."""
        self.node_problems: dict[str, str] = {}
        self.share_refusals: dict[str, str] = {}
        """Per node that takes whole GPUs only, why (its agent cannot enforce shares:
        :mod:`gpupool.api.enforcement`); slices are not placed there."""
        self.served_aliases: dict[str, frozenset[str]] = {}
        self.served_aliases_version = 0
        self.soft_tainted: set[str] = set()  # nodes with a PreferNoSchedule taint
        self._specs = NodeSpecs(self.names)
        self.requests = RequestMemo(self.names)
        """Translated requests of the pods seen, shared by the watch and the filter."""
        self._lending = LendingNames(self.names.domain)
        self.loans = NodeLoans(self._lending)
        """Every node's lent cards, booked in :attr:`state` (:mod:`gpupool.extender.lendable`)."""
        self.lending = Lending(self.pods, self._lending, borrow or BorrowSettings(), clock)
        """Who may borrow lent capacity, earliest request first (:mod:`gpupool.extender.borrowing`)."""
        self.nodes_synced = False
        self.pods_synced = False
        self.tenancy = TenancyBook(TenancyNames(self.names.domain))
        """Resource groups, GPU quotas and namespaces' default groups (fed by
        :mod:`gpupool.extender.tenancy_watch`; read and changed under :attr:`lock`)."""
        self.admissions = Admissions(self.tenancy)
        self.tenancy_required = tenancy_required
        """Whether readiness waits for the tenancy objects (the extender watches them)."""

    # ------------------------------------------------------------------------------ readiness
    @property
    def synced(self) -> bool:
        """True once one full list of nodes and of pods (and, when required, of the tenancy
        objects, of DRA claims and of DeviceClasses when watched) has been applied."""
        return (self.nodes_synced and self.pods_synced and (not self.tenancy_required or self.tenancy.all_synced)
                and (not self.claims.required or self.claims.synced) and self.claims.classes_synced)

    def refresh_profile(self) -> None:
        """Rebuild the scheduler with the workload profile of the pods known now.

        Fragmentation-aware policies score against the workload the cluster actually runs; the
        profile changes slowly, so this is called after sync and then every few minutes.
        """
        with self.lock:
            requests = [r.request for r in self.pods.values() if r.request is not None]
            self.profile = WorkloadProfile.from_pods(requests) if requests else None
            self.scheduler = Scheduler(self.state, make_policy(self.policy_name), profile=self.profile)

    # ---------------------------------------------------------------------------------- nodes
    def upsert_node(self, node: Mapping[str, Any] | Any) -> None:
        """Apply an ADDED/MODIFIED node; a node with a broken inventory keeps no cards, with a reason."""
        raw = as_dict(node)
        with self.lock:
            try:
                spec = self._specs.spec_for(raw)
                self._check_settings(spec.name, raw)
            except TranslationError as exc:
                name = node_name(raw)
                if not name:
                    log.warning("ignoring node without a name: %s", exc)
                    return
                spec = NodeSpec(name=name, cpu_milli=0, memory_mib=0)
                self.node_problems[name] = str(exc)
                log.warning("%s", exc)
            refusal = share_refusal(raw, self.names)
            if refusal is None:
                self.share_refusals.pop(spec.name, None)
            else:
                self.share_refusals[spec.name] = refusal
            served = served_aliases(raw)
            if self.served_aliases.get(spec.name) != served:
                self.served_aliases[spec.name] = served
                self.served_aliases_version += 1
            (self.soft_tainted.add if has_soft_taint(raw) else self.soft_tainted.discard)(spec.name)
            old = self.state.index.get(spec.name)
            if old is None or not self.state.present[old] or self.state.specs[old] != spec:
                self.state.upsert_node(spec)  # heartbeats change status fields we do not read
                self.keeper.sync_node(spec.name)
                self.claims.sync_node(spec.name)
            self.loans.apply(self.state, raw, spec)

    def _check_settings(self, name: str, raw: Mapping[str, Any]) -> None:
        """Record (and log once) why the node's agent runs with other settings, or clear it."""
        annotations = (raw.get("metadata") or {}).get("annotations") or {}
        problem = (settings_problem(name, annotations, self.settings, config_map=self.settings_source)
                   if isinstance(annotations, Mapping) else None)
        if problem is None:
            self.node_problems.pop(name, None)
        elif self.node_problems.get(name) != problem:
            self.node_problems[name] = problem
            log.warning("no GPU pods on node %s: %s", name, problem)

    def _add_new_nodes(self, raws: list[dict[str, Any]]) -> None:
        """Add the nodes of a list that the ledger does not know yet, with one allocation.

        A first list (or a re-list that brings many new nodes) would otherwise grow the ledger one
        node at a time. Nodes whose description is broken are left to :meth:`upsert_node`, which
        records the reason.
        """
        specs: list[NodeSpec] = []
        for raw in raws:
            name = node_name(raw)
            if not name or name in self.state.index:
                continue
            try:
                specs.append(self._specs.spec_for(raw))
            except TranslationError:
                continue
        if not specs:
            return
        self.state.add_nodes(specs)
        for spec in specs:  # pods that name a node that was not there yet
            self.node_problems.pop(spec.name, None)
            self.keeper.sync_node(spec.name)
            self.claims.sync_node(spec.name)

    def remove_node(self, name: str) -> None:
        """Apply a DELETED node; its bookings go with it and come back if the node does."""
        with self.lock:
            self.state.remove_node(name)
            self.node_problems.pop(name, None)
            self.share_refusals.pop(name, None)
            if self.served_aliases.pop(name, None) is not None:
                self.served_aliases_version += 1
            self.soft_tainted.discard(name)
            self._specs.forget(name)
            self.loans.forget(name)
            self.keeper.sync_node(name)
            self.claims.sync_node(name)

    def replace_nodes(self, nodes: Iterable[Mapping[str, Any] | Any]) -> None:
        """Apply a full list (start, or re-list after 410 Gone): upsert all, remove the rest."""
        with self.lock:
            raws = [as_dict(node) for node in nodes]
            self._add_new_nodes(raws)
            seen: set[str] = set()
            for raw in raws:
                self.upsert_node(raw)
                seen.add(node_name(raw))
            for spec in list(self.state.specs):
                if spec.name not in seen and self.state.present[self.state.index[spec.name]]:
                    self.remove_node(spec.name)
            self.nodes_synced = True

    # ----------------------------------------------------------------------------------- pods
    def upsert_pod(self, pod: Mapping[str, Any] | Any) -> None:
        """Apply an ADDED/MODIFIED pod. An update of its status alone carries its record over
        (:mod:`gpupool.extender.status_updates`) instead of reading the pod again."""
        raw = as_dict(pod)
        key = listed_key(raw)
        # The earlier record is read without the lock: whichever thread's record it is, it was read
        # from the object it keeps, so carrying it over gives what reading ``raw`` would.
        record = carried_over(self.pods.get(key) if key is not None else None, raw)
        if record is None:
            record = read_pod(raw, self.names, self.requests)
        with self.lock:
            if record is None:
                try:
                    key = pod_key(raw)
                except TranslationError:
                    return
                if key in self.pods:
                    self._forget(key)
                return
            old = self.pods.get(record.key)
            if old is not None and old.uid != record.uid:
                self._forget(record.key)  # same name, new pod
            self.pods[record.key] = record
            self.uids[record.uid] = record.key
            self.keeper.sync(record.key)

    def remove_pod(self, pod: Mapping[str, Any] | Any) -> None:
        """Apply a DELETED pod: its cards are free again (a bind in flight keeps its reservation)."""
        raw = as_dict(pod)
        try:
            key = pod_key(raw)
        except TranslationError:
            return
        with self.lock:
            uid = str((raw.get("metadata") or {}).get("uid") or "")
            record = self.pods.get(key)
            if record is not None and uid and record.uid != uid:
                return  # a delete of an older pod of the same name
            self.keeper.forget_pin(key, uid)
            self._forget(key)

    def replace_pods(self, pods: Iterable[Mapping[str, Any] | Any]) -> None:
        """Apply a full list of pods: upsert all, forget the rest (except binds in flight)."""
        with self.lock:
            seen: set[str] = set()
            for pod in pods:
                raw = as_dict(pod)
                try:
                    key = pod_key(raw)
                except TranslationError:
                    continue
                seen.add(key)
                known = self.pods.get(key)
                if known is not None and known.same_object(raw):
                    continue  # a catch-up or re-list of a current view re-translates nothing
                self.upsert_pod(raw)
            for key in [k for k in self.pods if k not in seen]:
                self.keeper.forget_pin(key, self.pods[key].uid)
                self._forget(key)
            self.pods_synced = True

    def _forget(self, key: str) -> None:
        record = self.pods.pop(key, None)
        if record is not None:
            self.uids.pop(record.uid, None)
        self.keeper.gone(key)
        self.keeper.sync(key)

    def _announce_release(self, key: str) -> None:
        for listener in self.release_listeners:
            try:
                listener(key)
            except Exception:  # a listener's bug must not stop the watch from keeping the ledger
                log.exception("release listener failed for pod %s", key)

    # ------------------------------------------------------------------------------- admission
    def admit(self, request: PodRequest, tenant: PodTenancy | None, node: str | None = None) -> Admission:
        """The pod under its group, quotas and card controls (:meth:`Admissions.admit`; call under
        the lock; ``node``: a bind's). A pod the tenancy book leaves alone
        (:meth:`TenancyBook.leaves_alone`: no group, no card controls, nothing in its namespace) is
        admitted as asked without walking the layers, the answer they would give."""
        if tenant is not None and request.wants_gpu and self.tenancy.leaves_alone(tenant):
            return Admission(request, tenant=tenant.namespace)
        return self.admissions.admit(self.state, request, tenant, node=node)

    # ------------------------------------------------------------------------ filter assumptions
    def assume(self, asked: PodRequest, admission: Admission, node: str, hold_s: float) -> Placement | None:
        """Book the filter's choice for the pod on ``node``, the one node its answer passes, as
        ``ASSUMED`` for ``hold_s`` seconds (:meth:`BookingKeeper.assume`): the filters of other
        pods see it before the bind comes. ``asked``: the pod's request as translated,
        ``admission``: it under the pod's tenancy (the filter's). None when nothing was booked."""
        with self.lock:
            check = admission.quota_check(self.state) if admission.quotas else None  # no quota: no check
            return self.keeper.assume(asked, admission.request, node, self.scheduler, hold_s=hold_s,
                                      check=check, borrow=self._borrow)

    def unassume(self, key: str, why: str) -> None:
        """End the filter's assumption for pod ``key``, if it has one (why: see
        :data:`gpupool.extender.booking_keeper.ASSUMPTION_ENDS`)."""
        with self.lock:
            self.keeper.unassume(key, why)

    def drop_lapsed(self) -> list[str]:
        """End the assumptions past their deadline; returns their pods."""
        with self.lock:
            return self.keeper.drop_lapsed()

    @property
    def assumption_ends(self) -> Mapping[str, int]:
        """Assumptions ended, by how (read under :attr:`lock`)."""
        return self.keeper.assumption_ends

    @property
    def assumed_pods(self) -> int:
        """Pods the filter's assumptions hold now (read under :attr:`lock`)."""
        return len(self.keeper.assumptions)

    # ---------------------------------------------------------------------- binder reservations
    def expire(self) -> list[str]:
        """Re-evaluate unbound assignments and pins against the clock, and end assumptions past
        their deadline; returns pods whose booking ended."""
        with self.lock:
            return self.keeper.expire()

    def reserve(self, request: PodRequest, node: str, tenant: PodTenancy | None = None,
                uid: str = "") -> Placement | Unschedulable:
        """Choose the cards for a bind in flight and book them, atomically under the lock.

        The pod's previous booking (its filter's assumption, an expired or stale assignment of an
        earlier attempt, or one another replica just wrote) is lifted while the core decides, so a
        retried bind does not compete with itself; it is restored when the pod no longer fits,
        except an assumption, which ends. The cards its filter assumed on this node for the same
        request become the reservation when they still pass the checks. A node with a claim whose
        assignment cannot be read takes no GPU pod (its free cards are not known). ``tenant``: the
        pod's tenancy: its group and pools must hold the node, and its quotas are checked against
        the exact placement in the same step as it is booked (:mod:`gpupool.kube.tenancy_layers`).

        Cards the API holds or may hold for the pod (``uid``: an earlier bind's write the watch has
        not shown, or the watch shows the pod bound) are never lifted: the same cards are reserved
        again, or the bind is refused (:meth:`BookingKeeper.reserve`).
        """
        with self.lock:
            admission = self.admit(request, tenant, node)
            if admission.error is not None:
                return Unschedulable(request.key, admission.error)
            row = self.state.index.get(node)
            refusal = admission.node_refusal(self.state, row) if row is not None and admission.layers else None
            if refusal is not None:
                return Unschedulable(request.key, refusal)
            check = admission.quota_check(self.state) if admission.quotas else None  # no quota: no check
            decision = self.keeper.reserve(admission.request, node, self.scheduler, check=check,
                                           borrow=self._borrow, asked=request, uid=uid)
            if isinstance(decision, Placement) and decision.borrowed_from is not None:
                self.lending.placed += 1
            return decision

    def _borrow(self, request: PodRequest, node: str) -> Placement | Unschedulable:
        """The bind's choice on ``node``'s lent capacity (under the lock)."""
        return self.lending.assign(self.state, request, node, self.new_policy, self.profile)

    def new_policy(self) -> PlacementPolicy:
        """A fresh instance of the placement policy (what-if and lent-capacity views prepare theirs)."""
        return make_policy(self.policy_name)

    def commit(self, key: str, assignment: Assignment, node: str = "") -> None:
        """The bind wrote ``assignment`` (or may have): hold its cards until the watch shows it.
        ``node``: the node its Binding named ("": the assignment's; a remote share's is its server).

        Without a reservation (a concurrent bind of the same pod ended it) the cards are taken from
        the assignment itself: it is written, so it holds them.
        """
        with self.lock:
            self.keeper.commit(key, assignment, node)

    def pinned_node(self, key: str, uid: str = "") -> str | None:
        """The node an earlier bind of pod ``key`` (of ``uid``; "": any) bound it to, or may have,
        while the watch has not shown that write; None when there is no such write."""
        with self.lock:
            pin = self.keeper.own_pin(key, uid)
            return pin.node if pin is not None else None

    def rollback(self, key: str) -> None:
        """The bind failed: give the reservation back and book what the API last said instead."""
        with self.lock:
            self.keeper.rollback(key)

    def in_flight(self) -> int:
        """Binds currently holding a reservation."""
        with self.lock:
            return self.keeper.in_flight()

    # ---------------------------------------------------------------------------------- reads
    def pod_object(self, key: str) -> dict[str, Any] | None:
        """The last pod object the watch delivered for ``key`` (GPU pods only), or None."""
        with self.lock:
            record = self.pods.get(key)
            return dict(record.raw) if record is not None and record.raw is not None else None

    def key_for_uid(self, uid: str) -> str | None:
        """``namespace/name`` of a known pod by uid."""
        with self.lock:
            return self.uids.get(uid)

    def holders_on(self, node: str) -> list[Holder]:
        """The pods bound to ``node`` whose request reads, with priority, borrower mark and cards
        (a pod whose priority cannot be read is never offered as a victim)."""
        with self.lock:
            row = self.state.index.get(node)
            found: list[Holder] = []
            for key in sorted(self.state.pods_on.get(row, ()) if row is not None else ()):
                record = self.pods.get(key)
                if record is None or record.request is None or record.node_name != node:
                    continue
                cards = tuple(sorted(self.state.placements[key].held_per_card()))
                found.append(Holder(key, record.uid, record.request.priority,
                                    is_borrower(record.raw, self._lending), cards))
            return found

    def node_spec_of(self, name: str) -> NodeSpec | None:
        """The spec of a present node."""
        with self.lock:
            return self.keeper.spec_of(name)

    @property
    def bookings(self) -> dict[str, Booking]:
        """Every known pod's booking (read under :attr:`lock`)."""
        return self.keeper.bookings

    @property
    def released_bookings(self) -> Mapping[str, int]:
        """Bookings given back because their pod ended, by how (read under :attr:`lock`)."""
        return self.keeper.released

    @property
    def problems(self) -> BookingProblems:
        """Over-committed cards and unreadable claims (read under :attr:`lock`)."""
        return self.keeper.problems

    @property
    def claim_problems(self) -> dict[str, str]:
        """Per node with a bound pod whose assignment cannot be read, why GPU pods are refused there."""
        return self.problems.refused_nodes

    def unreadable_on(self, node: str) -> frozenset[str]:
        """Pods bound to ``node`` whose assignment cannot be read."""
        with self.lock:
            return self.problems.unreadable_on(node)

    @property
    def conflicts(self) -> dict[str, str]:
        """Per pod holding an over-committed card, which one (empty when every claim fits)."""
        with self.lock:
            return self.problems.conflicts(self.state)

    def overcommitted_cards(self) -> int:
        """Cards whose claims exceed them now."""
        with self.lock:
            return self.problems.overcommitted_cards()

    def unreadable_assignments(self) -> int:
        """Bound pods whose assignment cannot be read."""
        with self.lock:
            return len(self.problems.unreadable)

    def take_notices(self) -> list[Notice]:
        """Booking problems to report as Events, each once, oldest first."""
        with self.lock:
            return self.problems.take_notices()


def now_utc() -> dt.datetime:
    """The current time, timezone-aware (assignments are stamped with it)."""
    return dt.datetime.now(dt.UTC)
