"""gpupool's own placement policy (the default).

It starts from FGD's insight (place each pod where it raises fragmentation against the expected
workload least) and changes what the paper's simulator does in ways that lose packing quality:

* the fragmentation change is compared exactly, not through ``int(100 * sigmoid(x / 1000))``, which
  lumps every change smaller than ~10 milli-GPU into one score and leaves the choice to node order;
* ties and near-ties are broken towards the node and card that are already fuller (best fit), so
  idle nodes and idle cards stay whole for the multi-card and whole-card pods that need them.
"""

from __future__ import annotations

import numpy as np

from gpupool.core.cards import NodeScratch, SharedCardChooser
from gpupool.core.fragmentation import FloatArray
from gpupool.core.model import GpuRequest
from gpupool.core.policies.base import PodShape, gpu_free
from gpupool.core.policies.fgd import FragmentationPolicy
from gpupool.core.state import BoolArray, ClusterState, IntArray

PACKING_WEIGHT = 1e-4
"""Weight of the best-fit tie-breaker, in milli-GPU of fragmentation per milli-GPU left free."""


class GpupoolPolicy(FragmentationPolicy):
    """Exact fragmentation gradient with a best-fit tie-breaker."""

    name = "gpupool"

    def _card_values(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        gains = self.card_gains(state, shape, rows, fits)
        free = gpu_free(state, rows)
        leftover = free.sum(axis=1, keepdims=True).astype(np.float64)
        card_left = free.astype(np.float64)
        values: FloatArray = gains - PACKING_WEIGHT * (leftover + card_left / 8.0)
        return values

    def score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        values = self._card_values(state, shape, rows, fits)
        if shape.gpu is None:
            return values[:, 0]
        result: FloatArray = np.where(fits, values, -np.inf).max(axis=1)
        return result

    def shared_chooser(self) -> SharedCardChooser:
        def choose(state: ClusterState, scratch: NodeScratch, request: GpuRequest, mask: BoolArray,
                   cpu_milli: int) -> int:
            rows = np.array([scratch.row], dtype=np.int64)
            shape = PodShape(cpu_milli=cpu_milli or 100, memory_mib=0, gpu=request)
            values = self._card_values(state, shape, rows, mask[None, :])[0]
            return int(np.argmax(np.where(mask, values, -np.inf)))

        return choose
