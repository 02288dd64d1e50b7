"""Which cards are lent now, with whose idle hold, and the file that lets a restarted agent resume.

A card is lent from the moment the usage monitor calls it idle (held, no SM activity for
``--idle-after``) until one of its owners (the containers that held it then, not borrowers) opens it
again or leaves the node. Its lendable memory is what its holders leave free in the last usage
sample (rounded down to the memory unit); its compute is the whole card (idle: nobody computes).
A card is not lent while a holder without a gpupool share of it is high priority: a borrower's
first open would be refused (rule 3), nor while a process the node cannot name holds it (it could
not be given back), except an infrastructure holder, which keeps the device open on every GPU
node and does no work on it: a host daemon the monitor names so (``--infrastructure-holders``:
nvidia-persistenced, DCGM), or a pod that asked for no GPU in an infrastructure namespace
(``--infrastructure-namespaces``: the GPU Operator's DaemonSets), whatever its priority. Nor is it
lent while an undecided holder holds it (a pod's process recorded before the pod watch listed, where
it could be infrastructure: it may be a tenant's, and is judged once the list is in); a loan already
made, resumed after a restart, stays.

DRA claims. A container that uses a prepared claim is booked on the claim's cards as on an
assignment's (:mod:`gpupool.nodeagent.lending.pods`), so a claim's pod is an owner like any other:
holding the card idle, it lends the memory it holds without using (and the card's compute), and
when it comes back (an open: rule 1, since it is booked; or its activity, read from the claim's
region and NVML) its borrowers are reclaimed while its allocations wait for room (the wait bound
is written in the claim's region). What makes returning safe for an owner is that it is one: the
loan names it, so its activity is watched and its allocations wait from the moment the card is lent.
A prepared claim that no container holding the card uses is no owner of the loan: nothing would
watch it, and the first allocation of its container (kubelet prepares the claim before the
container starts) would find the borrower's memory taken and fail rather than wait. So its share
is **never lent**: the loan is the card's free memory less the memory such claims hold there, and
100 % compute less theirs; a whole-card claim not held lends nothing of the card. A claim prepared
on a card already lent (the driver's prepare checks it against the borrowers' bookings too, so no
borrower holds its memory) shrinks the loan by its share (:func:`keep_new_claims`), so no later
borrower is offered it; the loan never grows back.

Owners booked on the card. The same holds for an extended-resource container booked on the card that
is not among the loan's owners (not started when the card went idle, or placed there by the
extender after the loan began: owners' and borrowers' bookings are two budgets): its share is never
lent (:func:`new_loans` leaves it out) and a loan it arrives on shrinks once (:func:`keep_new_bookings`;
the service reclaims just enough borrowers to fit it again). :mod:`gpupool.nodeagent.lending.bookings`
says which containers count.

The loans are written to a small JSON file next to the monitor's state after every change, so an
agent restarted mid-lend keeps the same owners dormant (their holds do not refuse the borrowers
already running) and still returns the card when an owner opens it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from gpupool.api.lending import LendableCard, Priority
from gpupool.nodeagent.container_shares import ClaimKey
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.lending.bookings import BookingKey, Share, owner_bookings, total
from gpupool.nodeagent.lending.claims import ClaimShares, booked_on, unheld_on
from gpupool.nodeagent.lending.durable import write_json_atomically
from gpupool.nodeagent.lending.pods import LendingPod
from gpupool.nodeagent.lending.rules import ContainerKey
from gpupool.nodeagent.monitor.usage_sampling import UsageSample
from gpupool.nodeagent.monitor.usage_state import DeviceState, UsageState
from gpupool.nodeagent.types import MEMORY_UNIT

NO_CLAIMS: ClaimShares = {}

log = logging.getLogger(__name__)

LOANS_VERSION = 1
FULL_COMPUTE_PERCENT = 100
PER_MILLE_PER_PERCENT = 10


@dataclass(frozen=True)
class Loan:
    """One lent card: its owners (dormant until they open it again) and what a borrower may take."""

    card: int
    uuid: str
    path: str
    owners: frozenset[ContainerKey]
    memory_mib: int
    compute_percent: int
    idle_since: float
    kept: frozenset[ClaimKey] = frozenset()
    """The prepared DRA claims on the card whose share the loan leaves out (used by no holder or owner)."""
    kept_bookings: frozenset[BookingKey] = frozenset()
    """The containers booked on the card, not among its owners, whose share the loan leaves out."""

    @property
    def first_owner(self) -> ContainerKey:
        return min(self.owners)

    def offer(self) -> LendableCard:
        """The card as the ``lendable`` annotation lists it."""
        namespace, pod, container = self.first_owner
        return LendableCard(self.card, self.uuid, f"{namespace}/{pod}", container, self.memory_mib,
                            self.compute_percent, self.idle_since)


def new_loans(state: UsageState, cards: Mapping[str, int], inventory: GpuInventory, sample: UsageSample | None,
              pod_of: Callable[[tuple[str, str]], LendingPod | None], lent: Iterable[int],
              claims: ClaimShares = NO_CLAIMS, pods: Iterable[LendingPod] = ()) -> list[Loan]:
    """Idle cards not lent yet that may be lent now (``claims``: the prepared DRA claims, whose share
    is kept out of the loan while no container holding the card uses them; ``pods``: the node's pods,
    whose containers booked on the card that are not its owners keep their share out; see the module)."""
    pods = list(pods)
    already = set(lent)
    found = []
    for device in state.devices:
        card = cards.get(device.path)
        if card is None or card in already or device.state is not DeviceState.IDLE or not device.holders:
            continue
        if any(h.undecided for h in device.holders):
            continue  # maybe a tenant's: judged once the pod watch has listed (docs/monitor.md)
        owners: set[ContainerKey] = set()
        held: set[ClaimKey] = set()
        refused = False
        for holder in device.users:  # an infrastructure holder (a host daemon, a DCGM pod) is neither owner nor bar
            pod = pod_of((holder.namespace, holder.pod)) if holder.pod else None
            if pod is None or not holder.container:
                refused = True  # a holder the node cannot name: never lend what it cannot give back
                break
            held.update((pod.namespace, claim) for claim in pod.claims.get(holder.container, ()))
            if pod.borrowed:
                continue
            if card not in pod.booked.get(holder.container, frozenset()) and pod.priority is Priority.HIGH:
                refused = True
                break
            owners.add((holder.namespace, holder.pod, holder.container))
        if refused or not owners:
            continue
        info = next((c for c in inventory.cards if c.index == card), None)
        if info is None or not info.healthy:
            continue
        usage = sample.card(card) if sample is not None else None
        used = usage.memory_used_mib if usage is not None else info.memory_mib
        kept = unheld_on(card, claims, held)
        bookings = owner_bookings(card, pods, owners)
        kept_mib, kept_milli, kept_whole = total((booked_on(card, claims, kept), *bookings.values()))
        free = max(0, info.memory_mib - used - kept_mib) // MEMORY_UNIT * MEMORY_UNIT
        compute = FULL_COMPUTE_PERCENT - _percent(kept_milli)
        if free <= 0 or compute <= 0 or kept_whole:
            continue
        since = device.last_use if device.last_use is not None else state.updated
        found.append(Loan(card, info.uuid, device.path, frozenset(owners), free, compute, since, kept,
                          frozenset(bookings)))
    return found


def _percent(per_mille: int) -> int:
    """Per-mille of a card in whole percent, rounded up (what is kept from a loan is never less)."""
    return -(-per_mille // PER_MILLE_PER_PERCENT)


def _less(loan: Loan, kept: Share) -> tuple[int, int]:
    """The loan's memory (MiB, whole units) and compute (percent) once ``kept`` is left out of it;
    nothing when ``kept`` is the whole card."""
    mib, milli, whole = kept
    if whole:
        return 0, 0
    return (max(0, loan.memory_mib - mib) // MEMORY_UNIT * MEMORY_UNIT,
            max(0, loan.compute_percent - _percent(milli)))


def keep_new_claims(loan: Loan, claims: ClaimShares, used_by: Collection[ClaimKey]) -> Loan:
    """``loan`` less the share of the claims prepared on its card since it began that ``used_by``
    (the claims the card's holders and the loan's owners use) does not name; the same loan when
    there are none. A loan shrunk to nothing stays (its borrowers are not reclaimed for it: the
    driver prepared the claim beside their bookings) but offers nothing."""
    new = unheld_on(loan.card, claims, {*used_by, *loan.kept})
    if not new:
        return loan
    memory, compute = _less(loan, booked_on(loan.card, claims, new))
    return replace(loan, memory_mib=memory, compute_percent=compute, kept=loan.kept | new)


def keep_new_bookings(loan: Loan, pods: Iterable[LendingPod]) -> Loan:
    """``loan`` less the share of the containers booked on its card (of pods that do not borrow) that
    are neither its owners nor already left out (:attr:`Loan.kept_bookings`): an owner placed on the
    card since it was lent, or one that was not holding it yet; the same loan when there are none.
    Each is left out once (its key is kept, and the loan file keeps it across a restart); the loan
    never grows back. A loan shrunk to nothing stays but offers nothing."""
    new = {key: share for key, share in owner_bookings(loan.card, pods, loan.owners).items()
           if key not in loan.kept_bookings}
    if not new:
        return loan
    memory, compute = _less(loan, total(new.values()))
    return replace(loan, memory_mib=memory, compute_percent=compute, kept_bookings=loan.kept_bookings | set(new))


class LoanFile:
    """The loans on disk (JSON, written atomically: :mod:`~gpupool.nodeagent.lending.durable`); a missing or
    unreadable file is no loans."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> list[Loan]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                doc = json.load(fh)
            if doc.get("version") != LOANS_VERSION:
                raise ValueError(f"version {doc.get('version')!r}")
            return [Loan(int(x["card"]), str(x["uuid"]), str(x["path"]),
                         frozenset((str(a), str(b), str(c)) for a, b, c in x["owners"]),
                         int(x["memoryMiB"]), int(x["computePercent"]), float(x["idleSince"]),
                         frozenset((str(a), str(b)) for a, b in x.get("claimsKept", ())),
                         frozenset((str(a), str(b)) for a, b in x.get("bookingsKept", ())))
                    for x in doc["loans"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("ignoring the lending file %s: %s", self.path, exc)
            return []

    def save(self, loans: Iterable[Loan]) -> None:
        doc = {"version": LOANS_VERSION, "loans": [
            {"card": x.card, "uuid": x.uuid, "path": x.path, "owners": sorted(x.owners), "memoryMiB": x.memory_mib,
             "computePercent": x.compute_percent, "idleSince": x.idle_since,
             **({"claimsKept": sorted(x.kept)} if x.kept else {}),
             **({"bookingsKept": sorted(x.kept_bookings)} if x.kept_bookings else {})}
            for x in sorted(loans, key=lambda x: x.card)]}
        write_json_atomically(self.path, doc)
