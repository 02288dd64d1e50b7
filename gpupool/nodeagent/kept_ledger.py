"""The node's one-node ledger kept between checks, exactly as a rebuild would make it.

Two callers check a grant against the core's ledger of this node (:class:`NodeLedger`) many times
in a row: the device plugin's Allocate (:func:`~gpupool.nodeagent.schedule_check.check_assignment`,
against the pods granted on the node) and the DRA driver's prepare
(:meth:`ClaimState.check_fits <gpupool.nodeagent.dra.claim_state.ClaimState.check_fits>`, against
the device plugin's pods and the claims prepared already). Building the ledger for every check made
N grants at once cost N builds of up to N claims each (docs/node-agent.md, "Latency"; docs/dra.md,
"Prepare latency"). :class:`KeptLedger` keeps it instead, for both.

Exactness. A rebuild claims pods in one order: the pods the caller lists on the check, then the
pods it appends between checks (:meth:`KeptLedger.append`: a claim just prepared; on a rebuild, the
caller's ``appended()``). The kept ledger claims what a rebuild would claim, in that order, or is
built afresh:

- the listed pods begin with those listed before (compared by what a claim books of each,
  :func:`booking_key`) and none was appended since: only the listed pods after them are claimed;
- a pod appended is claimed after all the others (a rebuild claims it last too);
- anything else builds afresh: another inventory (a card resized or turned unhealthy), a listed pod
  gone, finished or given another assignment, more pods listed after some were appended (they would
  be claimed before those), or :meth:`KeptLedger.forget` (the caller released a pod: the core's
  release does not always restore what a rebuild would have, e.g. a card held over capacity);
- a claim that raises drops the ledger: the next check builds it again (and raises as a rebuild
  would).

Property tests compare the kept ledger with one built for the check
(``tests/nodeagent/test_kept_ledger.py``) and each caller's verdicts with those it gives on a
ledger built for the check (``tests/nodeagent/test_schedule_check_shortcut.py``,
``tests/nodeagent/dra/test_prepare_ledger_kept.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from gpupool.core.model import Placement
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.schedule_check import NodeLedger
from gpupool.nodeagent.types import PodView

BookingKey = tuple[str, str, str, bool, Placement | None]
"""What :meth:`NodeLedger.claim` books of a pod: its names, uid, whether it ended, its placement."""


def booking_key(pod: PodView) -> BookingKey:
    """What a claim of ``pod`` books: two pods with equal keys are claimed alike."""
    return (pod.namespace, pod.name, pod.uid, pod.terminated,
            None if pod.assignment is None else pod.assignment.placement)


def nothing_appended() -> tuple[PodView, ...]:
    return ()


class KeptLedger:
    """This node's ledger of granted pods, kept between checks and claimed on incrementally."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._ledger: NodeLedger | None = None
        self._inventory: GpuInventory | None = None
        self._listed: list[BookingKey] = []
        """The listed pods claimed on the kept ledger, in order."""
        self._appended = 0
        """How many pods were claimed after them (appended, or ``appended()`` on the rebuild)."""
        self.rebuilds = 0
        """How many times the ledger was built (the tests read it)."""

    def ledger(self, inventory: GpuInventory, listed: Sequence[PodView],
               appended: Callable[[], Iterable[PodView]] = nothing_appended) -> NodeLedger:
        """The ledger of ``inventory``'s cards with ``listed`` claimed in that order, then the pods
        appended since it was built. ``appended``: called only to build it afresh, the pods that
        follow ``listed`` then (those :meth:`append` would have claimed)."""
        keys = [booking_key(pod) for pod in listed]
        kept = len(self._listed)
        if (self._ledger is None or inventory != self._inventory or keys[:kept] != self._listed
                or (len(keys) > kept and self._appended)):
            return self._build(inventory, listed, keys, appended)
        ledger = self._ledger
        try:
            for pod, key in zip(listed[kept:], keys[kept:], strict=True):
                ledger.claim(pod)
                self._listed.append(key)
        except Exception:
            self._ledger = None
            raise
        return ledger

    def _build(self, inventory: GpuInventory, listed: Sequence[PodView], keys: list[BookingKey],
               appended: Callable[[], Iterable[PodView]]) -> NodeLedger:
        self._ledger = None
        self.rebuilds += 1
        ledger = NodeLedger.of(self.node, inventory)
        count = 0
        for pod in listed:
            ledger.claim(pod)
        for pod in appended():
            ledger.claim(pod)
            count += 1
        self._ledger, self._inventory, self._listed, self._appended = ledger, inventory, keys, count
        return ledger

    def append(self, view_of: Callable[[GpuInventory], PodView]) -> None:
        """A pod was granted after all those claimed: claim it on the kept ledger (if one is kept),
        its view made by ``view_of`` from the inventory the ledger was built from. A pod that cannot
        be claimed drops the ledger rather than failing the caller's grant: the next check builds it
        afresh."""
        if self._ledger is None or self._inventory is None:
            return
        try:
            self._ledger.claim(view_of(self._inventory))
        except Exception:
            self._ledger = None
            return
        self._appended += 1

    def forget(self) -> None:
        """A pod claimed here was released: the next check builds the ledger afresh."""
        self._ledger = None
