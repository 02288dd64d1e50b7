"""The kubelet devices of lent capacity: ``lend-`` + the ID a card's own device of that amount has.

kubelet admits a container only when the node has enough free devices of each resource it asks
for; while a card is lent the agent advertises its lendable memory and compute as extra devices of
the same gpupool resources (the patent: the idle card reported to kubelet through the device plugin
as an extended resource), so a borrower is admitted even where the owner's booking took the card's
own devices. Whole cards (``gpu``) are never lent: the owner keeps its memory on the card.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.api.lending import lend_device_id
from gpupool.nodeagent.device_layout import DeviceLayout
from gpupool.nodeagent.lending.loans import Loan


def lent_devices(layout: DeviceLayout, resource: str, loans: Iterable[Loan]) -> list[tuple[str, bool]]:
    """(ID, healthy) of the lent devices of ``resource``; none for whole cards or unknown resources."""
    unit = layout.units.get(resource)
    if unit is None or not unit.tag:
        return []
    out: list[tuple[str, bool]] = []
    for loan in sorted(loans, key=lambda x: x.card):
        ids = layout.card_ids(resource, loan.card, loan.memory_mib)
        if unit.fixed:  # percent of compute: as many as the loan lends
            ids = ids[:loan.compute_percent]
        out.extend((lend_device_id(i), True) for i in ids)
    return out
