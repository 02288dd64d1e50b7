"""A pod's own node and card policy on top of the cluster's (HAMi's per-pod binpack / spread).

The cluster runs one policy (``--policy``); a pod may name another way to pick its node, its cards
or both (:class:`gpupool.core.pod_policy.PolicyChoice`). :class:`PerPodPolicy` answers with the
named policy for that part and the cluster's policy for the rest, so the scheduler scores, filters
and chooses cards through one interface whatever the pod asked. Node binpack and spread are
Alibaba gpushare's modes (:mod:`gpupool.core.policies.baseline`), which are also what HAMi's
``hami.io/node-scheduler-policy`` values mean: fill the fullest node that fits, or take the
emptiest one. The card choice applies to slices; whole cards take idle cards whatever the policy.
"""

from __future__ import annotations

from gpupool.core.cards import SharedCardChooser
from gpupool.core.fragmentation import FloatArray, WorkloadProfile
from gpupool.core.pod_policy import PolicyChoice
from gpupool.core.policies.base import PlacementPolicy, PodShape
from gpupool.core.policies.baseline import BinpackPolicy, SpreadPolicy
from gpupool.core.state import BoolArray, ClusterState, IntArray

CHOSEN: dict[str, type[PlacementPolicy]] = {"binpack": BinpackPolicy, "spread": SpreadPolicy}
"""The policy behind each choice name (for nodes and for cards alike)."""


class PerPodPolicy(PlacementPolicy):
    """The cluster's ``base`` policy with the parts ``choice`` names replaced."""

    name = "per-pod"

    def __init__(self, base: PlacementPolicy, choice: PolicyChoice) -> None:
        super().__init__(base.rng)
        self.base = base
        self.choice = choice
        self.node_policy = CHOSEN[choice.node](base.rng) if choice.node else base
        self.card_policy = CHOSEN[choice.card](base.rng) if choice.card else base

    def prepare(self, state: ClusterState, profile: WorkloadProfile | None) -> None:
        super().prepare(state, profile)
        for part in (self.node_policy, self.card_policy):
            if part is not self.base:  # the base was prepared by its scheduler already
                part.prepare(state, profile)

    def scores_are_node_local(self) -> bool:
        return self.node_policy.scores_are_node_local()

    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        return self.node_policy.node_score(state, shape, rows, fits)

    def normalize(self, scores: FloatArray) -> FloatArray:
        return self.node_policy.normalize(scores)

    def shared_chooser(self) -> SharedCardChooser | None:
        return self.card_policy.shared_chooser()
