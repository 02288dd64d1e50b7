"""A pod's own node and card policy on top of the cluster's (HAMi's per-pod binpack / spread).

The cluster runs one policy (``--policy``); a pod may name another way to pick its node, its cards
or both (:class:`gpupool.core.pod_policy.PolicyChoice`). :class:`PerPodPolicy` answers with the
named policy for that part and the cluster's policy for the rest, so the scheduler scores, filters
and chooses cards through one interface whatever the pod asked. Node binpack and spread are
Alibaba gpushare's modes (:mod:`gpupool.core.policies.baseline`), which are also what HAMi's
``hami.io/node-scheduler-policy`` values mean: fill the fullest node that fits, or take the
emptiest one. The card choice follows HAMi's ``gpu-scheduler-policy``: a card's use is its used
share of compute plus its used share of memory; binpack takes the most used card that fits,
spread the least used (gpushare's spread looks at compute only and would not tell memory-only
slices apart). It applies to slices; whole cards take idle cards whatever the policy.
"""

from __future__ import annotations

import numpy as np

from gpupool.core.cards import NodeScratch, SharedCardChooser
from gpupool.core.fragmentation import FloatArray, WorkloadProfile
from gpupool.core.model import GpuRequest
from gpupool.core.pod_policy import PolicyChoice
from gpupool.core.policies.base import PlacementPolicy, PodShape
from gpupool.core.policies.baseline import BinpackPolicy, SpreadPolicy
from gpupool.core.state import BoolArray, ClusterState, IntArray

CHOSEN: dict[str, type[PlacementPolicy]] = {"binpack": BinpackPolicy, "spread": SpreadPolicy}
"""The node policy behind each choice name."""


def card_use(scratch: NodeScratch) -> FloatArray:
    """Per card, its used share of compute plus its used share of memory (0..2; HAMi's card score)."""
    compute = 1.0 - scratch.compute_free / np.maximum(scratch.book.compute_total, 1)
    memory = 1.0 - scratch.mem_free / np.maximum(scratch.mem_total, 1)
    return np.asarray(compute + memory, dtype=np.float64)


def use_chooser(fullest: bool) -> SharedCardChooser:
    """The card of a slice by :func:`card_use`: the most used (binpack) or least used (spread) of the
    fitting cards; ties to the lowest index."""
    def choose(state: ClusterState, scratch: NodeScratch, request: GpuRequest, mask: BoolArray,
               cpu_milli: int) -> int:
        candidates = np.flatnonzero(mask)
        use = card_use(scratch)[candidates]
        return int(candidates[int(np.argmax(use) if fullest else np.argmin(use))])

    return choose


CARD_CHOOSERS: dict[str, SharedCardChooser] = {"binpack": use_chooser(True), "spread": use_chooser(False)}


class PerPodPolicy(PlacementPolicy):
    """The cluster's ``base`` policy with the parts ``choice`` names replaced."""

    name = "per-pod"

    def __init__(self, base: PlacementPolicy, choice: PolicyChoice) -> None:
        super().__init__(base.rng)
        self.base = base
        self.choice = choice
        self.node_policy = CHOSEN[choice.node](base.rng) if choice.node else base
        self.card_chooser = CARD_CHOOSERS[choice.card] if choice.card else base.shared_chooser()

    def prepare(self, state: ClusterState, profile: WorkloadProfile | None) -> None:
        super().prepare(state, profile)
        if self.node_policy is not self.base:  # the base was prepared by its scheduler already
            self.node_policy.prepare(state, profile)

    def scores_are_node_local(self) -> bool:
        return self.node_policy.scores_are_node_local()

    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        return self.node_policy.node_score(state, shape, rows, fits)

    def scores_read_ledger_rows(self) -> bool:
        return self.node_policy.scores_read_ledger_rows()

    def scores_cost_dearly(self) -> bool:
        return self.node_policy.scores_cost_dearly()

    def scores_read_pod_memory(self) -> bool:
        return self.node_policy.scores_read_pod_memory()

    def share_scores(self, state: ClusterState, shape: PodShape, source: IntArray, target: IntArray) -> None:
        self.node_policy.share_scores(state, shape, source, target)

    def normalize(self, scores: FloatArray) -> FloatArray:
        return self.node_policy.normalize(scores)

    def shared_chooser(self) -> SharedCardChooser | None:
        return self.card_chooser
