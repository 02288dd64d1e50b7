"""The lending service of the node agent: loans, the rules at every open, reclaims, publication.

Threads: the event source calls :meth:`LendingService.decide` (an opener may be waiting) and the
recorder calls :meth:`LendingService.on_open` after recording a holder, both on the source's
thread; everything else runs on the agent's event loop. Loans and the set of pods in reclaim are
guarded by one lock; reclaims are handed to the loop with ``call_soon_threadsafe``. Each step also
reads the owners of every loan (:mod:`~gpupool.nodeagent.lending.owner_activity`, files in a worker
thread): an owner that computes again without opening the card is handled as if it had opened it.

Where the source can answer opens (fanotify) a refusal fails the opener's ``open()``. Where the
kernel's cgroup-device gate runs (:class:`~gpupool.nodeagent.containers.container_gate.ContainerGate`:
every kernel with cgroup2 and root, 6.18 included, where fanotify is blind to devices) the
refusals are precomputed: after every recorded open and every step, each container whose open of a
card the rules would refuse now (rule 3: a borrower beside a high holder; any card of a pod being
reclaimed) is denied that card in the kernel, so its ``open()`` fails with ``EPERM``; an owner is
never in that set (facing its borrowers it is rule 1). Where neither runs (the /proc scan alone),
and for an open that came before the gate was updated, the same decision is applied to the
recorded open: a refused asker's pod is reclaimed (its processes stopped), within one scan interval.
Infrastructure holders (a host daemon, a pod that asked for no GPU in an infrastructure namespace:
docs/monitor.md) are invisible to the rules: their opens are allowed and move nothing, their holds
bar no one, and they are never owners nor reclaimed. So are undecided holders (a pod's process
recorded before the pod watch listed, where it could be infrastructure) until the monitor judges
them; no new loan is made of a card one of them holds meanwhile
(:func:`~gpupool.nodeagent.lending.loans.new_loans`), and the restart's check of the borrowers waits
for the monitor to have judged them all.

Every reclaim is written to the reclaim journal (:mod:`~gpupool.nodeagent.lending.reclaim_journal`)
before anything is signalled, on the thread that decided it, and before the loan it ends is removed
from ``lending.json``. A restarted agent drops the loans those reclaims ended, finishes the reclaims
from the step they had reached, and keeps their cards out of lending until the monitor has seen
them in use and idle again. Once the pod watch has listed the node's pods it also judges every
borrower still holding a card as if it had just opened it: a borrower beside an owner whose card is
no longer lent is stopped, whatever the journal said (the safety net for a journal that could not
be read).

A pod whose reclaim finished stays in the journal's ``reclaimed`` list until the pod watch no longer
lists it (deleted, or absent from a full list): until then none of its containers starts again
(:meth:`LendingService.start_refusal`) and the rules count it as being reclaimed (refused every open,
its holds bar no one, never reclaimed a second time), also across a restart of the agent.

DRA claims (``--dra``): a container that uses a prepared claim is booked on the claim's cards
(:mod:`~gpupool.nodeagent.lending.pods`), so the rules, the owners, their activity and their waits
treat it as an assignment's container; a claim no holder or owner uses is kept out of the loans,
those that begin and those already running (:mod:`~gpupool.nodeagent.lending.loans` says why).

Owners booked on a lent card that are not its loan's owners (:mod:`~gpupool.nodeagent.lending.bookings`)
are kept out of the loans the same way; a loan shrunk below what its borrowers are booked is kept and
just enough of its borrowers are reclaimed as for a returning owner to bring the others within it
(:mod:`~gpupool.nodeagent.lending.over_loan` says which go first). Such an owner and the loan's
borrowers are not judged against each other at open (rules' ``left_out``): the owner's share is
not lent, so its first open reclaims none of them. Each step does it, and so does the container's
Allocate (:meth:`LendingService.owner_granted`, told by the checkpoint backend once the container's
region exists), which also writes the container's wait bound before it can start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field

from gpupool.api.lending import DEFAULT_CHECKPOINT_DEADLINE_S, RECLAIMED_REASON, Priority
from gpupool.nodeagent.containers.container_gate import ContainerGate
from gpupool.nodeagent.device_layout import DeviceLayout
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.lending.bookings import booked_containers, left_out
from gpupool.nodeagent.lending.claims import ClaimShares
from gpupool.nodeagent.lending.devices import lent_devices
from gpupool.nodeagent.lending.loans import (
    PER_MILLE_PER_PERCENT,
    Loan,
    LoanFile,
    keep_new_bookings,
    keep_new_claims,
    new_loans,
)
from gpupool.nodeagent.lending.options import ActivityThresholds
from gpupool.nodeagent.lending.over_loan import borrowers_booked, reclaim_to_fit
from gpupool.nodeagent.lending.owner_activity import OwnerWatch
from gpupool.nodeagent.lending.pods import LendingPod, LendingPods
from gpupool.nodeagent.lending.processes import PodProcesses
from gpupool.nodeagent.lending.publisher import LendablePublisher
from gpupool.nodeagent.lending.reclaim import Reclaimer, ReclaimOrder, ReclaimResult
from gpupool.nodeagent.lending.reclaim_journal import JOURNAL_FILE, ReclaimJournal, ReclaimRecord
from gpupool.nodeagent.lending.region_control import OWNER_WAIT_MARGIN_S, RegionControl
from gpupool.nodeagent.lending.rules import Claim, ContainerKey, Occupant, OpenDecision, PodKey, Rule, decide_open
from gpupool.nodeagent.monitor.events import DeviceEvent, Verdict
from gpupool.nodeagent.monitor.service import UsageMonitor
from gpupool.nodeagent.monitor.usage_state import DeviceState, Holder, ProcessIdentity, UsageState

log = logging.getLogger(__name__)

PRIORITY_RECORDED = {Priority.HIGH: 1, Priority.LOW: 0}
"""What the monitor's state file records as a holder's ``priority`` (rules 2 and 4)."""

GATE_DECIDER = "lending"
"""The lending rules' name among the device gate's deciders."""


@dataclass(frozen=True)
class LendingConfig:
    """The agent's ``--lending`` options."""

    loans_path: str
    deadline_s: float = DEFAULT_CHECKPOINT_DEADLINE_S
    activity: ActivityThresholds = field(default_factory=ActivityThresholds)
    shim_state_dir: str | None = None
    """Where the interception library's per-container regions are (``--state-dir``); ``None``: not read."""


class LendingService:
    """Owns the loans of one node and applies the rules; :meth:`start`, then :meth:`run`."""

    def __init__(self, monitor: UsageMonitor, inventory: Callable[[], GpuInventory], layout: DeviceLayout,
                 pods: LendingPods, reclaimer_factory: Callable[[Callable[[PodKey], Awaitable[None]]], Reclaimer],
                 publisher: LendablePublisher, devices_changed: Callable[[], Awaitable[None]],
                 config: LendingConfig, identify: Callable[[int], ProcessIdentity],
                 gate: ContainerGate | None = None) -> None:
        self.monitor = monitor
        self.gate = gate
        """The kernel's refusal at open, where it runs (``None``: refusals by reclaim only)."""
        self.pods = pods
        self.publisher = publisher
        self.config = config
        self._inventory = inventory
        self._layout = layout
        self._devices_changed = devices_changed
        self._identify = identify
        self._file = LoanFile(config.loans_path)
        self._lock = threading.Lock()
        self._loans: dict[int, Loan] = {}
        self._reclaiming: set[PodKey] = set()
        self.journal = ReclaimJournal(os.path.join(os.path.dirname(config.loans_path) or ".", JOURNAL_FILE))
        self.reclaimer = reclaimer_factory(self._after_stop)
        if self.reclaimer.on_step is None:
            self.reclaimer.on_step = self.journal.advance
        self._judged_borrowers = False
        self.watch = OwnerWatch(config.activity, pods.get, config.shim_state_dir)
        self._returned: set[int] = set()
        """Cards whose owner came back by activity while the monitor still calls them idle (memory only):
        not lent again until the monitor has seen them busy (loop thread only)."""
        self.regions = RegionControl(config.shim_state_dir, pods.get) if config.shim_state_dir else None
        """Owners' wait bounds and borrowers' freezes in the library's regions (``None``: no library)."""
        self._waiting: dict[int, frozenset[ContainerKey]] = {}
        """Card → the owners whose allocations on it wait for room now (their regions say so)."""
        self._waits_lock = threading.Lock()
        """Guards :attr:`_waiting`: written by the step (a worker thread) and by Allocate (the loop)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.decisions: list[tuple[str, OpenDecision]] = []
        """The last decisions that did anything (for logs, /usage and tests), newest last."""

    # ------------------------------------------------------------------ state
    @property
    def loans(self) -> dict[int, Loan]:
        with self._lock:
            return dict(self._loans)

    @property
    def reclaiming(self) -> frozenset[PodKey]:
        with self._lock:
            return frozenset(self._reclaiming)

    def start_refusal(self, pod: PodKey, uid: str = "") -> str | None:
        """Why a container of ``pod`` (UID ``uid``, when known) must not start now, or ``None``.

        From the moment its reclaim is decided until the pod leaves the node, none of its containers
        starts again. kubelet restarts a container that exited after writing its checkpoint before
        the eviction reaches it, and the restart runs with the first Allocate's environment (no
        ``GPUPOOL_RESUME_FROM``): it starts the task over, and the eviction's SIGTERM has it write a
        checkpoint of that fresh count, newer than the reclaim's, which the task's next pod would
        resume from (issue 26). The device plugin's PreStartContainer asks this."""
        with self._lock:
            in_flight = pod in self._reclaiming
        finished = bool(uid) and self.journal.reclaimed().get(pod) == uid
        evicted = f"({RECLAIMED_REASON}): it is evicted and none of its containers starts again"
        if finished:
            return f"its GPU was reclaimed {evicted}"
        record = self.journal.get(pod) if in_flight else None
        if in_flight and (not uid or record is None or not record.uid or record.uid == uid):
            return f"its GPU is being reclaimed {evicted}"
        return None

    def device_list(self, resource: str) -> list[tuple[str, bool]]:
        """The lent devices of ``resource`` now (the device plugin adds them to the card's own)."""
        return lent_devices(self._layout, resource, self.loans.values())

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Resume the loans of the previous agent whose owners still hold their card, hook the rules into
        the monitor's recorder, and queue the first publication."""
        self._loop = loop
        state = self.monitor.state
        journal = self.journal.load()
        ended = {r.card for r in journal.records if r.returned and r.card is not None}
        if journal.unreadable:  # a reclaim of any card may have been lost: vouch for no loan
            log.error("the reclaim journal could not be read whole: no loan is resumed, no card is lent until the "
                      "monitor has seen it in use and idle again, and borrowers left beside an owner are stopped")
            self._returned.update(self.monitor.cards.values())
        for loan in self._file.load():
            device = state.device(loan.path)
            held = ({(h.namespace, h.pod, h.container) for h in device.holders if not h.infrastructure}
                    if device else set())  # an undecided owner is still an owner
            if journal.unreadable:
                log.warning("not resuming the loan of card %d: the reclaim journal is unreadable", loan.card)
            elif loan.card in ended:
                log.warning("not resuming the loan of card %d: its owner came back and its borrowers' reclaim was "
                            "in progress", loan.card)
            elif loan.owners & held:
                self._loans[loan.card] = loan
                log.info("resuming the loan of card %d (owners %s)", loan.card, sorted(loan.owners))
            else:
                log.info("dropping the loan of card %d: no owner holds it any more", loan.card)
        self._returned.update(ended)
        self._save()
        with self._lock:
            self._reclaiming.update(r.pod for r in journal.records)
        for record in journal.records:
            self._start_reclaim(record)
        self.monitor.recorder.use_rules(self.decide, self.priority_of, self.on_open)
        self.publisher.offer(x.offer() for x in self._loans.values())

    # ------------------------------------------------------------------ the rules (source thread)
    def decide(self, event: DeviceEvent) -> Verdict:
        """Answer an open the source holds; reclaims start asynchronously."""
        try:
            who = self._identify(event.pid)
        except Exception:
            log.exception("lending: cannot tell who pid %d is; allowing its open", event.pid)
            return Verdict.ALLOW
        return self._apply(event.path, who, "open")

    def on_open(self, path: str, holder: Holder) -> None:
        """A recorded open (every source): the rules again, enforced by reclaiming where needed."""
        self._apply(path, self._identity(holder), "recorded open")
        self.refuse_now()

    def refusals(self) -> dict[str, set[str]]:
        """Container ID → the card files the rules would refuse it now, had it asked: what the kernel's
        gate is told to refuse before the open. Only containers whose assignment (own or borrowed)
        names the card are judged (others cannot open it through the runtime's device rules);
        an owner never is refused: facing its borrowers it is rule 1."""
        return self._judge_askers()[0]

    def _reclaimed_here(self, pods: Iterable[LendingPod] | None = None) -> frozenset[PodKey]:
        """The pods whose reclaim finished that are still on the node (``pods``, else the watch's, lists
        them with the same UID): the rules count them as being reclaimed until they leave, so they are
        refused every open, their holds bar no one, and they are never reclaimed a second time (no
        second checkpoint signal, eviction or ``GpuReclaimed`` event)."""
        done = self.journal.reclaimed()
        if not done:
            return frozenset()
        if pods is None:
            listed = {key: p.uid for key in done if (p := self.pods.get(key)) is not None}
        else:
            listed = {p.key: p.uid for p in pods if p.key in done}
        return frozenset(key for key, uid in done.items() if listed.get(key) == uid)

    def _judge_askers(self) -> tuple[dict[str, set[str]], dict[PodKey, tuple[int, str]]]:
        """:meth:`refusals`, and the pods refused by rule 3 (with a card and why): the rules reclaim a
        refused asker, and behind the gate its open never reaches the monitor."""
        state, pods = self.monitor.state, self.pods.all()
        reclaimed = self._reclaimed_here(pods)
        with self._lock:
            loans, reclaiming = dict(self._loans), frozenset(self._reclaiming) | reclaimed
        out: dict[str, set[str]] = {}
        doomed: dict[PodKey, tuple[int, str]] = {}
        for path, card in self.monitor.cards.items():
            device = state.device(path)
            holders = [o for o in (self._occupant(self._identity(h), path) for h in (device.holders if device else ()))
                       if o is not None]
            loan = loans.get(card)
            dormant = loan.owners if loan is not None else frozenset()
            spared = left_out(loan.kept_bookings, pods) if loan is not None else frozenset()
            for pod in pods:
                for container, cid in pod.container_ids.items():
                    if not cid or card not in pod.cards.get(container, ()):
                        continue
                    asker = self._occupant(ProcessIdentity(cid, container, pod.name, pod.namespace), path)
                    if asker is None:
                        continue
                    decision = decide_open(asker, holders, dormant=dormant, reclaiming=reclaiming,
                                           left_out=spared)
                    if decision.verdict is Verdict.DENY:
                        out.setdefault(cid, set()).add(path)
                    if decision.rule is Rule.REFUSE_LOW_ASKER:
                        doomed.setdefault(pod.key, (card, decision.reason))
        return out, doomed

    def refuse_now(self) -> None:
        """Bring the kernel's gate to :meth:`refusals` (no-op without a gate; never raises)."""
        if self.gate is None:
            return
        try:
            refusals, doomed = self._judge_askers()
            self.gate.set(GATE_DECIDER, refusals)
            self._reclaim_refused(doomed)
        except Exception:
            log.exception("lending: cannot update the device gate; refusals fall back to reclaims")

    def _reclaim_refused(self, doomed: dict[PodKey, tuple[int, str]]) -> None:
        """Reclaim the askers the gate refuses by rule 3 (the rules reclaim a refused asker; its open
        never succeeds, so the monitor would never record it): a borrower whose loan ended goes."""
        reclaimed = self._reclaimed_here()
        with self._lock:
            new = [(pod, card, why) for pod, (card, why) in doomed.items()
                   if pod not in self._reclaiming and pod not in reclaimed]
            self._reclaiming.update(pod for pod, _, _ in new)
        if not new:
            return
        records = [self._record(pod, card, f"refused at open: {why}", returned=False) for pod, card, why in new]
        self.journal.begin(records)
        for pod, card, why in new:
            if self.regions is not None:
                self.regions.freeze(pod, card)
            log.warning("card %d: %s/%s is refused at open by the kernel (rule 3: %s); it is reclaimed", card, *pod,
                        why)
        for record in records:
            self._call(self._start_reclaim, record)

    def priority_of(self, who: ProcessIdentity, path: str) -> int | None:
        """The priority recorded for a new holder (``None``: not in a known pod)."""
        occupant = self._occupant(who, path)
        if occupant is None:
            return None
        return PRIORITY_RECORDED[Priority.LOW if occupant.claim is Claim.BORROWED else occupant.priority]

    def _apply(self, path: str, who: ProcessIdentity, what: str) -> Verdict:
        card = self.monitor.cards.get(path)
        asker = self._occupant(who, path)
        if card is None or asker is None:
            return Verdict.ALLOW
        device = self.monitor.state.device(path)
        holders = [o for o in (self._occupant(self._identity(h), path) for h in (device.holders if device else ()))
                   if o is not None]
        reclaimed = self._reclaimed_here()
        with self._lock:
            loan = self._loans.get(card)
            dormant = loan.owners if loan is not None else frozenset()
            spared = self._left_out(loan, (asker, *holders))
            leaving = frozenset(self._reclaiming) | reclaimed
            decision = decide_open(asker, holders, dormant=dormant, reclaiming=leaving, left_out=spared)
            ended = None
            if decision.verdict is Verdict.ALLOW and asker.container in dormant:
                ended = self._loans.pop(card)  # the owner is back: the card returns to it
            new = [p for p in decision.reclaim if p not in leaving]
            self._reclaiming.update(new)
        if self.regions is not None:  # at once: a borrower being reclaimed allocates nothing more
            for pod in new:
                self.regions.freeze(pod, card)
        records = [self._record(pod, card, decision.reason or f"card {card} is needed",
                                returned=decision.verdict is Verdict.ALLOW) for pod in new]
        if records:  # durable before the loan leaves lending.json and before anything is signalled
            self.journal.begin(records)
        if ended is not None:
            log.warning("card %d: %s by owner %s; the loan ends", card, what, "/".join(asker.container))
            self._call(self._loan_ended)
        if new or decision.verdict is Verdict.DENY:
            log.warning("card %d %s by %s: rule %d, %s; %s", card, what, "/".join(asker.container),
                        decision.rule, decision.verdict, decision.reason)
            self.decisions = [*self.decisions[-99:], (path, decision)]
        for record in records:
            self._call(self._start_reclaim, record)
        return decision.verdict

    def _left_out(self, loan: Loan | None, occupants: Iterable[Occupant]) -> frozenset[ContainerKey]:
        """Those of ``occupants`` booked on ``loan``'s card whose share it leaves out (:func:`left_out`):
        they and its borrowers are not judged against each other; the borrowers past the loan are
        reclaimed by its size (:meth:`_over_loans`)."""
        if loan is None or not loan.kept_bookings:
            return frozenset()
        pods = [p for p in (self.pods.get(o.pod) for o in occupants) if p is not None]
        return left_out(loan.kept_bookings, pods)

    def _record(self, pod: PodKey, card: int, why: str, returned: bool) -> ReclaimRecord:
        info = self.pods.get(pod)
        ids = frozenset(i for i in (info.container_ids.values() if info else ()) if i)
        return ReclaimRecord(pod, info.uid if info else "", ids, why, self.config.deadline_s, card, returned)

    def _occupant(self, who: ProcessIdentity, path: str) -> Occupant | None:
        """The rules' view of a process on ``path``; ``None`` for one they ignore: not in a known pod
        container, an infrastructure holder or an undecided one (neither a bar nor an owner, never
        reclaimed)."""
        if not who.pod or not who.container or who.infrastructure or who.undecided:
            return None
        pod = self.pods.get((who.namespace, who.pod))
        card = self.monitor.cards.get(path)
        if pod is None or card is None:
            return None
        if pod.borrowed:
            claim = Claim.BORROWED
        elif card in pod.booked.get(who.container, frozenset()):
            claim = Claim.BOOKED
        else:
            claim = Claim.UNBOOKED
        return Occupant((who.namespace, who.pod, who.container), pod.priority, claim)

    @staticmethod
    def _identity(holder: Holder) -> ProcessIdentity:
        return ProcessIdentity(holder.container_id, holder.container, holder.pod, holder.namespace,
                               holder.infrastructure, holder.undecided)

    def _call(self, fn: Callable[..., object], *args: object) -> None:
        if self._loop is None:
            return
        self._loop.call_soon_threadsafe(fn, *args)

    # ------------------------------------------------------------------ on the loop
    def _start_reclaim(self, record: ReclaimRecord) -> None:
        """Run (or resume, from the journal's latest step) one recorded reclaim."""
        pod = record.pod
        if pod in self.reclaimer.in_flight:
            return
        latest = self.journal.get(pod) or record
        info = self.pods.get(pod)  # a container restarted since the record has a new ID
        ids = latest.container_ids | frozenset(i for i in (info.container_ids.values() if info else ()) if i)
        inits_only = info.process_checkpoint if info is not None else False
        order = ReclaimOrder(pod, PodProcesses(latest.uid or (info.uid if info else ""), ids, inits_only), latest.why,
                             latest.deadline_s, latest.step, latest.signalled_at)
        task = self.reclaimer.reclaim(order)
        task.add_done_callback(lambda done: self._reclaim_done(pod, done))

    def _reclaim_done(self, pod: PodKey, task: asyncio.Task[ReclaimResult]) -> None:
        """A reclaim ended: forget it, or keep its record (cancelled or failed) for the next try."""
        if task.cancelled() or task.exception() is not None:
            if not task.cancelled():
                log.error("the reclaim of %s/%s failed (%r); it is tried again", *pod, task.exception())
            return
        record = self.journal.finish(pod)  # kept among the reclaimed until the pod leaves the node
        with self._lock:
            self._reclaiming.discard(pod)
        if record is not None and record.returned and record.card is not None:
            self._returned.add(record.card)  # lent again only once its owner was seen using it and idle

    async def _after_stop(self, pod: PodKey) -> None:
        """A reclaimed pod's processes are gone: withdraw what is no longer lent, publish at once."""
        await self._changed()
        await self.publisher.publish_now()

    def _loan_ended(self) -> None:
        self._save()
        self.publisher.offer(x.offer() for x in self.loans.values())
        assert self._loop is not None
        self._loop.create_task(self._notify_devices())

    async def _notify_devices(self) -> None:
        await self._devices_changed()

    async def _changed(self) -> None:
        self._save()
        self.publisher.offer(x.offer() for x in self.loans.values())
        await self._devices_changed()

    def _owner_back(self, loan: Loan, owner: ContainerKey) -> None:
        """An owner computes again without opening the card: the same rules as its open (rule 1)."""
        namespace, name, container = owner
        pod = self.pods.get((namespace, name))
        container_id = pod.container_ids.get(container, "") if pod is not None else ""
        self._apply(loan.path, ProcessIdentity(container_id, container, name, namespace), "owner activity")
        if loan.card not in self.loans:
            self._returned.add(loan.card)

    async def step(self) -> None:
        """End loans whose owners compute again or left the node, lend the cards that went idle."""
        state, sample = self.monitor.state, self.monitor.last_sample
        for record in self.journal.records():  # a reclaim that failed, or a restart's, not running now
            self._start_reclaim(record)
        undecided = any(h.undecided for device in state.devices for h in device.holders)
        if not self._judged_borrowers and self.pods.synced and not undecided:  # the monitor judges them first
            self._judged_borrowers = True
            self._judge_borrowers()
        for loan, owner in await asyncio.to_thread(self.watch.observe, self.loans, sample, state):
            self._owner_back(loan, owner)
        self._returned = {c for c in self._returned if any(
            self.monitor.cards.get(d.path) == c and d.state is DeviceState.IDLE for d in state.devices)}
        if self.pods.synced:  # before the first full list an absent pod may merely be unknown yet
            self.journal.keep_reclaimed({p.key: p.uid for p in self.pods.all()})
        with self._lock:
            gone = [c for c, x in self._loans.items() if self.pods.synced
                    and all(self.pods.get((ns, pod)) is None for ns, pod, _ in x.owners)]
            for card in gone:
                log.info("card %d: its owners left the node; the loan ends", card)
                del self._loans[card]
            claims, pods = self.pods.claim_shares(), self.pods.all()
            shrunk = self._keep_new_claims(claims, state)
            booked = self._keep_new_bookings(pods, list(self._loans))
            over = self._over_loans(pods, state, list(self._loans))
            fresh = new_loans(state, self.monitor.cards, self._inventory(), sample, self.pods.get,
                              set(self._loans) | self._returned | self.journal.cards(), claims, pods)
            for loan in fresh:
                log.info("card %d is idle: lending %d MiB, %d %% (owners %s)", loan.card, loan.memory_mib,
                         loan.compute_percent, sorted(loan.owners))
                self._loans[loan.card] = loan
        self._reclaim_over_loan(over)
        if gone or fresh or shrunk or booked:
            await self._changed()
        await asyncio.to_thread(self._owner_waits)
        await asyncio.to_thread(self.refuse_now)

    def _keep_new_bookings(self, pods: list[LendingPod], cards: Collection[int]) -> list[int]:
        """Shrink each loan of ``cards`` by the owners booked on its card since it began (or not holding
        it when it began) that are not its owners (:func:`keep_new_bookings`; with the lock held).
        The cards whose loan shrank."""
        shrunk = []
        for card in cards:
            loan = self._loans.get(card)
            kept = keep_new_bookings(loan, pods) if loan is not None else None
            if loan is None or kept is None or kept == loan:
                continue
            self._loans[card] = kept
            log.warning("card %d: owner(s) %s booked on it while lent; the loan now offers %d MiB, %d %%", card,
                        ", ".join("/".join(k) for k in sorted(kept.kept_bookings - loan.kept_bookings)),
                        kept.memory_mib, kept.compute_percent)
            shrunk.append(card)
        return shrunk

    def _over_loans(self, pods: list[LendingPod], state: UsageState,
                    cards: Collection[int]) -> list[tuple[PodKey, int]]:
        """The borrowers to reclaim so that those of each loan of ``cards`` that left an owner's share
        out fit it again (:func:`reclaim_to_fit`: only as many as it takes, in its order), marked as
        being reclaimed (with the lock held, so an open decided meanwhile counts them gone). Checked at
        every step, not only when a loan shrinks: a borrower placed against the larger offer just
        before it shrank may arrive later, and such an owner's open no longer reclaims it. A loan that
        never left a booking out is not checked: only then can borrowers placed against it exceed it.
        Pods being reclaimed, or reclaimed and not deleted yet, are not counted. (Borrower, card) for
        each, none where they fit."""
        victims: list[tuple[PodKey, int]] = []
        for card in cards:
            loan = self._loans.get(card)
            if loan is None or not loan.kept_bookings:
                continue
            device = state.device(loan.path)
            leaving = self._reclaiming | self._reclaimed_here(pods)
            borrowers = borrowers_booked(card, pods, device.holders if device else (), leaving)
            chosen = reclaim_to_fit(borrowers, loan.memory_mib, loan.compute_percent * PER_MILLE_PER_PERCENT)
            if not chosen:
                continue
            log.warning("card %d: its borrowers hold more than the %d MiB, %d %% its loan offers now; reclaiming %s "
                        "(lowest priority, least work lost, largest first), keeping %s", card, loan.memory_mib,
                        loan.compute_percent, ", ".join("/".join(k) for k in chosen),
                        ", ".join("/".join(b.pod) for b in borrowers if b.pod not in chosen) or "none")
            self._reclaiming.update(chosen)
            victims.extend((pod, card) for pod in chosen)
        return victims

    def _reclaim_over_loan(self, victims: Collection[tuple[PodKey, int]]) -> None:
        """Reclaim the borrowers :meth:`_over_loans` chose, as for a returning owner (rule 1): frozen
        in their regions at once, journalled, then stopped and evicted."""
        if not victims:
            return
        records = [self._record(pod, card, f"card {card}'s loan shrank for an owner booked on it", returned=False)
                   for pod, card in victims]
        for pod, card in victims:
            if self.regions is not None:
                self.regions.freeze(pod, card)
        self.journal.begin(records)
        for record in records:
            self._call(self._start_reclaim, record)

    def owner_granted(self, pod_key: PodKey, container: str) -> None:
        """Allocate granted ``container`` its share, its region just created (before the container
        starts): on a card lent or draining now the loan leaves its share out at once and its wait
        bound is written now, not at the next step, so its first allocation never finds a borrower's
        memory in the way without waiting. On the agent's loop; never raises."""
        try:
            pod = self.pods.get(pod_key)
            if pod is None or pod.borrowed:
                return
            mine, pods = pod.booked.get(container, frozenset()), self.pods.all()
            with self._lock:
                shrunk = self._keep_new_bookings(pods, mine & set(self._loans))
                over = self._over_loans(pods, self.monitor.state, shrunk)
            self._reclaim_over_loan(over)
            if shrunk:
                assert self._loop is not None
                self._loop.create_task(self._changed())
                self._loop.create_task(self.publisher.publish_now())
            self._owner_waits()
        except Exception:
            log.exception("lending: after granting %s/%s/%s", *pod_key, container)

    def _keep_new_claims(self, claims: ClaimShares, state: UsageState) -> bool:
        """Shrink each loan by the DRA claims prepared on its card since it began that no holder of the
        card and no owner of the loan uses (:func:`keep_new_claims`; with the lock held). True when one
        shrank."""
        shrunk = False
        for card, loan in list(self._loans.items()):
            device = state.device(loan.path)
            users = [(h.namespace, h.pod, h.container) for h in (device.users if device else ())]
            used_by = {(ns, claim) for ns, name, container in (*users, *loan.owners)
                       for claim in self._claims_of(ns, name, container)}
            kept = keep_new_claims(loan, claims, used_by)
            if kept != loan:
                log.warning("card %d: DRA claim(s) %s prepared on it while lent; the loan now offers %d MiB, %d %%",
                            card, ", ".join("/".join(k) for k in sorted(kept.kept - loan.kept)), kept.memory_mib,
                            kept.compute_percent)
                self._loans[card] = kept
                shrunk = True
        return shrunk

    def _claims_of(self, namespace: str, name: str, container: str) -> tuple[str, ...]:
        pod = self.pods.get((namespace, name)) if name else None
        return pod.claims.get(container, ()) if pod is not None else ()

    def _owner_waits(self) -> None:
        """Owners of a lent card (its loan's, and every container booked on it that does not borrow,
        started or not: :func:`booked_containers`), or of one whose borrowers are still being
        reclaimed, wait for room on it; the others do not (a full card fails at once again). A
        container whose region does not exist yet is tried again at the next call."""
        if self.regions is None:
            return
        with self._waits_lock:
            self._write_waits(self.regions)

    def _write_waits(self, regions: RegionControl) -> None:
        """:meth:`_owner_waits` with its lock held: write what changed since the last call."""
        loans, draining, pods = self.loans, self.journal.cards(), self.pods.all()
        wanted = {card: loan.owners | booked_containers(card, pods) for card, loan in loans.items()}
        for card in draining:
            wanted[card] = wanted.get(card, frozenset()) | self._waiting.get(card, frozenset()) | booked_containers(
                card, pods)
        bound = self.config.deadline_s + OWNER_WAIT_MARGIN_S
        waiting: dict[int, frozenset[ContainerKey]] = {}
        for card, owners in self._waiting.items():
            if gone := owners - wanted.get(card, frozenset()):
                regions.set_owner_wait(gone, card, 0)
        for card, owners in wanted.items():
            have = self._waiting.get(card, frozenset()) & owners
            written = have | regions.set_owner_wait(owners - have, card, bound)
            if written:
                waiting[card] = written
        self._waiting = waiting

    def _judge_borrowers(self) -> None:
        """Once after a start, with the pods known and no holder undecided any more: every borrower
        holding a card faces the rules as if it had just opened it (one left beside an owner whose card
        is not lent any more is stopped)."""
        for device in self.monitor.state.devices:
            for holder in device.holders:
                pod = self.pods.get((holder.namespace, holder.pod)) if holder.pod else None
                if pod is not None and pod.borrowed:
                    self._apply(device.path, self._identity(holder), "held across a restart")

    async def run(self, every_s: float = 1.0) -> None:
        """The loop: a step every ``every_s`` and the publisher, until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.publisher.run())
            while True:
                try:
                    await self.step()
                except Exception:
                    log.exception("lending step failed; retrying")
                await asyncio.sleep(every_s)

    def _save(self) -> None:
        try:
            self._file.save(self.loans.values())
        except OSError as exc:
            log.error("cannot write the lending file %s: %s", self._file.path, exc)

