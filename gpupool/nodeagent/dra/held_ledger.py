"""The one-node ledger a DRA prepare is checked against, kept between prepares.

:meth:`ClaimState.check_fits <gpupool.nodeagent.dra.claim_state.ClaimState.check_fits>` asks the
core's card rule on a ledger of this node holding the device plugin's pods and every prepared
claim (:func:`gpupool.nodeagent.schedule_check.node_ledger`). Rebuilding that ledger on every call
made 100 prepares at once cost 100 rebuilds of up to 100 claims each (docs/dra.md, "Prepare
latency"). This keeps the ledger instead, exactly as a rebuild would make it:

- a claim prepared is claimed on the kept ledger after those before it, as a rebuild claims the
  prepared claims in the order they were prepared (after the device plugin's pods);
- an unprepared (or unbooked) claim drops the kept ledger: the next check rebuilds it. Releasing
  a claim in place would not always be exact (the core's release does not restore a card that
  was over capacity, and a second claim of the same name was keyed apart by its UID);
- a check rebuilds when the inventory or the device plugin's pods differ from those the kept
  ledger was built from (compared by value on every check: both are read fresh each time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.schedule_check import NodeLedger, node_ledger
from gpupool.nodeagent.types import PodView


class HeldLedger:
    """This node's ledger of held shares, rebuilt only when what it was built from changed."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._ledger: NodeLedger | None = None
        self._inventory: GpuInventory | None = None
        self._plugin: list[PodView] = []
        self.rebuilds = 0
        """How many times the ledger was built (the tests and the benchmark read it)."""

    def ledger(self, inventory: GpuInventory, plugin: Sequence[PodView],
               claims: Callable[[], list[PodView]]) -> NodeLedger:
        """The ledger holding ``plugin`` (the device plugin's pods now) and ``claims()`` (the
        prepared claims' views, called only to rebuild) on ``inventory``'s cards."""
        if self._ledger is None or inventory != self._inventory or list(plugin) != self._plugin:
            self._ledger = node_ledger(self.node, inventory, granted=[*plugin, *claims()])
            self._inventory, self._plugin = inventory, list(plugin)
            self.rebuilds += 1
        return self._ledger

    def add(self, claim: Callable[[GpuInventory], PodView]) -> None:
        """A claim was prepared after all those held: claim it on the kept ledger (if any), its
        view made (``claim``) from the inventory the ledger was built from, as a rebuild would."""
        if self._ledger is not None and self._inventory is not None:
            try:
                self._ledger.claim(claim(self._inventory))
            except Exception:  # the claim is prepared whatever the ledger says: the next check rebuilds
                self._ledger = None

    def forget(self) -> None:
        """A claim was unprepared: the next check rebuilds."""
        self._ledger = None
