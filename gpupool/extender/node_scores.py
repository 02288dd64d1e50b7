"""Prioritize's answer and the mapping of the policy's scores onto kube-scheduler's 0..10.

Apart from :mod:`gpupool.extender.service` (which re-exports these names) because the answer's type
and its scaling are a format of their own, used by the service and the HTTP adapter alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.fragmentation import FloatArray
from gpupool.core.state import IntArray

MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler's MaxExtenderPriority: extender scores are integers 0..10."""


@dataclass(frozen=True)
class NodeScores:
    """Prioritize's answer: ``scores[i]`` (0..10) for ``hosts[i]``, in the order asked.

    Why two aligned sequences and not a dict: the answer has an entry per node on every call, and
    zipping them into a dict only to walk it again to write JSON would double prioritize's time
    (docs/extender.md, "Numbers behind the code"). The HTTP adapter writes the JSON straight from
    the array.

    ``rows``: when set, the ledger row of every host (``rows[i]`` is ``hosts[i]`` in the layout
    numbered ``layout``), so an adapter can write the answer from per-row records it keeps.
    """

    hosts: list[str]
    scores: IntArray
    rows: IntArray | None = None
    layout: int | None = None

    @staticmethod
    def uniform(hosts: list[str], score: int = 0) -> NodeScores:
        return NodeScores(hosts, np.full(len(hosts), score, dtype=np.int64))

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self.hosts, self.scores.tolist(), strict=True))


def scale_scores(passed: list[str], scores: FloatArray, names: list[str]) -> NodeScores:
    """Map the policy's scores of feasible nodes onto 0..10 (min-max, rounded down); other nodes get 0.

    Exactly the nodes with the best score get 10 and every other node at most 9, so kube-scheduler,
    which takes a node of the highest total, chooses among the very nodes the simulator chooses
    among (rounding to nearest gave 10 to near-best nodes too: 99 and 100 on a 0..100 scale).
    """
    if not passed:
        return NodeScores.uniform(names)
    low, high = float(scores.min()), float(scores.max())
    if high == low:
        scaled = np.full(len(passed), MAX_EXTENDER_PRIORITY, dtype=np.int64)
    else:
        below_best = MAX_EXTENDER_PRIORITY - 1
        spread = np.floor((scores - low) * MAX_EXTENDER_PRIORITY / (high - low)).astype(np.int64)
        scaled = np.where(scores == high, MAX_EXTENDER_PRIORITY, np.minimum(spread, below_best))
    if len(passed) == len(names):  # the usual prioritize: every node asked about passed (in order)
        return NodeScores(names, scaled)
    position = {name: i for i, name in enumerate(names)}
    full = np.zeros(len(names), dtype=np.int64)
    full[[position[name] for name in passed]] = scaled
    return NodeScores(names, full)
