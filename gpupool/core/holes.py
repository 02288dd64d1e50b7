"""Dead holes: compute left free on a shared card that almost none of the workload's slices fit.

Why this exists: FGD's fragmentation measure judges a card's free compute by the typical pods that
cannot use it *now*. It does not see that some holes will be filled later and others never will.
On the default openb trace a 320-milli pod arriving at a card with 530 free (one 470 slice) or one
with 350 free (a 650 slice) scores within one bin either way (FGD gains 224 and 296 milli-GPU), yet
the first choice leaves 210 milli that only the rare 160/110/50-milli pods fit, the second leaves 30.
When the cluster runs out of whole cards, such pairings are a large part of what separates the
policy from an offline packing of the same slices (docs/policies.md, "Dead holes").

A hole of ``h`` milli is *dead* when the single-card slices of the workload that fit in it (milli
<= h) are fewer than ``share`` of all its slices. The policy charges a pod for the dead compute its
placement creates on the card and credits it for the dead compute it fills
(:class:`gpupool.core.policies.gpupool_policy.GpupoolPolicy`). The table follows the workload's own
typical pods, so a workload of small slices has no dead holes above its smallest common size.
"""

from __future__ import annotations

import numpy as np

from gpupool.core.fragmentation import FloatArray, WorkloadProfile
from gpupool.core.state import IntArray
from gpupool.core.units import COMPUTE_PER_CARD

DEAD_SHARE = 0.03
"""A hole is dead when fewer than this share of the workload's slices fit in it; wider cuts measured
worse (docs/policies.md, "Dead holes")."""


def dead_hole_table(profile: WorkloadProfile, share: float = DEAD_SHARE) -> FloatArray:
    """``table[h]``: the dead compute in a hole of ``h`` free milli (``h`` or 0), for h in 0..1000.

    Slices are the typical pods asking for less than a whole card (on one card or several), weighted
    by their frequency. A whole free card is never dead; without slices in the workload nothing is.
    """
    sizes = np.arange(COMPUTE_PER_CARD + 1)
    slices = [(pod.milli, pod.freq) for pod in profile.pods
              if pod.count >= 1 and 0 < pod.milli < COMPUTE_PER_CARD]
    total = sum(freq for _, freq in slices)
    if total <= 0:
        return np.zeros(COMPUTE_PER_CARD + 1)
    fitting_share = np.zeros(COMPUTE_PER_CARD + 1)
    for milli, freq in slices:
        fitting_share[milli:] += freq / total
    dead: FloatArray = np.where(fitting_share < share, sizes, 0).astype(np.float64)
    return dead


def dead_compute_change(table: FloatArray, free: IntArray, milli: int) -> FloatArray:
    """Per card, the dead compute a ``milli`` slice would create (positive) or fill (negative).

    ``free`` holds each card's free compute (0..1000, as the ledger keeps it); entries where the
    slice does not fit are meaningless (the caller masks them). Called for every candidate node of
    every slice, so it is three array operations (``np.clip`` alone cost more on these small arrays).
    """
    change: FloatArray = table.take(np.maximum(free - milli, 0)) - table.take(free)
    return change
