"""gpupool's own placement policy (the default).

It is FGD's fragmentation gradient (place each pod where it raises fragmentation against the expected
workload least) with these deliberate choices; each was measured on the openb traces, and the
numbers, the variants tried and the seeds are in docs/policies.md:

* The gain also counts CPU–GPU balance (:mod:`gpupool.core.balance`): ``BALANCE_WEIGHT`` times the
  GPU the pod would leave stranded for lack of CPU is subtracted from the fragmentation decrease.
  The largest single improvement, on every bundled trace.
* A CPU-only pod measures that stranding against a far larger reserve, ``CPU_ONLY_RESERVE`` times
  ``kappa`` per free GPU (:func:`gpupool.core.balance.cpu_only_kappa`): it pays for every core it
  takes from a node that still has free GPU, so it goes first where the GPUs are all allocated and
  leaves the CPU-rich nodes' headroom to CPU-heavy GPU pods. This matters when CPU runs out (the
  paper's CPU-share workloads, ``cpu250``).
* The gain also counts GPU-model scarcity (:mod:`gpupool.core.scarcity`): a pod pays
  ``SCARCITY_WEIGHT`` x its milli-GPU x the scarcity of the card's model, so pods that may run
  anywhere leave the models that restricted pods depend on (gpuspec10); traces without restricted
  pods are unchanged (the term is 0 there).

* The gain also counts dead holes (:mod:`gpupool.core.holes`): ``DEAD_HOLE_WEIGHT`` times the
  compute a slice leaves free on its card that almost none of the workload's slices fit (minus the
  dead compute it fills) is subtracted; it helped every bundled trace.

* Gains are compared in coarse bins, not exactly. Ranking nodes by exact fragmentation change looked
  like an obvious improvement and measured far worse: differences of a few milli-GPU are noise in
  the measure, and
  following them sends every pod of a shape to the same kind of node, exhausting its CPU. Binning
  leaves near-equal nodes to the scheduler's node order, which spreads such pods.
* The bin width is a parameter (``levels``); 50 levels over the sigmoid do at least as well as the
  paper's 100.

The whole-card and multi-card choice is the core's topology-aware one (Tencent GPUManager's rules),
which the paper's simulator does not have; the openb cluster publishes no topology, so on the trace
it reduces to the paper's lowest-index choice.
"""

from __future__ import annotations

import numpy as np

from gpupool.core.balance import cpu_only_kappa, cpu_per_gpu_milli, stranding_increase
from gpupool.core.cards import NodeScratch
from gpupool.core.fragmentation import FloatArray, WorkloadProfile
from gpupool.core.holes import dead_compute_change, dead_hole_table
from gpupool.core.policies.base import PodShape
from gpupool.core.policies.fgd import EXPONENT_CAP, FragmentationPolicy
from gpupool.core.scarcity import model_scarcity
from gpupool.core.state import BoolArray, ClusterState, IntArray

DEFAULT_LEVELS = 50
"""Number of score bins over the sigmoid of the fragmentation gain."""

BALANCE_WEIGHT = 2.0
"""Milli-GPU of fragmentation one milli-GPU of stranded GPU counts as: the smaller end of the range
where results are flat (docs/policies.md)."""

CPU_ONLY_RESERVE = 5.0
"""For CPU-only pods, the CPU a node keeps per free milli-GPU, in multiples of ``kappa``: the
smallest multiple tried whose reserve covers the CPU-richest nodes' cores per GPU, which is where
the gain appears (docs/policies.md, "CPU-only pods when CPU is scarce"). The bundled traces do not
move."""

SCARCITY_WEIGHT = 0.25
"""Charge per milli-GPU per unit of model scarcity: the middle of the range where results are flat
(docs/policies.md, "GPU-model scarcity")."""


DEAD_HOLE_WEIGHT = 4.0
"""Milli-GPU of fragmentation one milli-GPU of dead hole counts as: the best of the weights tried on
the tuning seeds, confirmed on held-out seeds (docs/policies.md, "Dead holes")."""


def binned_score(gain: FloatArray, levels: int) -> FloatArray:
    """``floor(levels * sigmoid(gain / 1000))``: equal for gains within one bin of each other.

    The exponent is capped (:data:`gpupool.core.policies.fgd.EXPONENT_CAP`) instead of silencing
    the overflow: the score there is 0 either way.
    """
    result: FloatArray = np.floor(levels / (1.0 + np.exp(np.minimum(-gain / 1000.0, EXPONENT_CAP))))
    return result


class GpupoolPolicy(FragmentationPolicy):
    """Fragmentation gradient plus CPU–GPU balance, model scarcity and dead holes over coarse bins."""

    name = "gpupool"
    levels = DEFAULT_LEVELS
    balance_weight = BALANCE_WEIGHT
    cpu_only_reserve = CPU_ONLY_RESERVE
    scarcity_weight = SCARCITY_WEIGHT
    dead_hole_weight = DEAD_HOLE_WEIGHT

    def prepare(self, state: ClusterState, profile: WorkloadProfile | None) -> None:
        super().prepare(state, profile)
        self.kappa = cpu_per_gpu_milli(profile) if profile is not None else None
        self.dead_holes = dead_hole_table(profile or WorkloadProfile(()))
        self._scarcity_key: tuple[int, int] | None = None
        self._scarcity: FloatArray = np.zeros(1)

    def scarcity_by_model_id(self, state: ClusterState) -> FloatArray:
        """Scarcity indexed by model id + 1 (index 0: no card); recomputed when nodes change."""
        key = (state.layout_version, len(state.models))
        if key != self._scarcity_key:
            present = state.card_exists & state.present[:, None]
            cards = np.bincount(state.card_model[present] + 1, minlength=len(state.models) + 1)
            capacity = {m: int(cards[i + 1]) * 1000 for i, m in enumerate(state.models) if cards[i + 1]}
            scarcity = model_scarcity(self.profile or WorkloadProfile(()), capacity)
            table = np.zeros(len(state.models) + 1)
            for i, model in enumerate(state.models):
                table[i + 1] = scarcity.get(model, 0.0)
            self._scarcity, self._scarcity_key = table, key
        return self._scarcity

    def card_gains(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        free = self.measure.card_free(rows)
        gains = self.fragment_gains(shape, rows, fits, free)
        gpu_taken = float(shape.milli * shape.count)
        if shape.shares_one_card and self.dead_hole_weight:
            gains = gains - self.dead_hole_weight * dead_compute_change(self.dead_holes, free, shape.milli)
        if self.kappa is not None and self.balance_weight:
            kappa = self.kappa if shape.gpu is not None else cpu_only_kappa(self.kappa, self.cpu_only_reserve)
            stranding = stranding_increase(np.add.reduce(free, axis=1).astype(np.float64),
                                           state.cpu_free.take(rows).astype(np.float64), kappa,
                                           gpu_taken, float(shape.cpu_milli))
            gains = gains - self.balance_weight * stranding[:, None]
        if shape.gpu is not None and self.scarcity_weight:
            scarcity = self.scarcity_by_model_id(state).take(state.card_model.take(rows, 0) + 1)
            if shape.shares_one_card:
                gains = gains - self.scarcity_weight * shape.milli * scarcity
            else:  # whole or several cards: the node's scarcest model stands for the cards it gives
                gains = gains - (self.scarcity_weight * gpu_taken * scarcity.max(axis=1))[:, None]
        result: FloatArray = gains
        return result

    def card_scores(self, gains: FloatArray) -> FloatArray:
        return binned_score(gains, self.levels)

    def card_tiebreak(self, scratch: NodeScratch) -> FloatArray:
        # Within the best bin, the tightest card: it keeps emptier cards whole.
        result: FloatArray = np.asarray(-1e-6 * scratch.compute_free, dtype=np.float64)
        return result
