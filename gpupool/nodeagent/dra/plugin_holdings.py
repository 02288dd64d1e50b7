"""What the device plugin's pods hold on this node's cards, for the DRA driver's check at prepare.

Until the extender books DRA claims and extended-resource pods in one ledger (docs/dra.md), a node
that takes both kinds of pods could get a claim on a card the extender filled. The DRA driver
refuses such a claim at prepare, with the reason on the pod, rather than over-commit the card.
What a pod holds is its assignment's placement on this node, read by the core's own rule
(:meth:`gpupool.core.model.Placement.held_per_card`: app containers add up, init containers take
the larger).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.nodeagent.types import PodView


def held_by_plugin_pods(node: str, pods: Iterable[PodView]) -> dict[int, tuple[int, int, bool]]:
    """Card (NVML index) → memory MiB, compute per mille, whole card, summed over ``pods`` (the
    pods kubelet lists) whose assignment places them on ``node``."""
    out: dict[int, tuple[int, int, bool]] = {}
    for pod in pods:
        if pod.terminated or pod.assignment is None or pod.assignment.placement.node not in ("", node):
            continue
        for card, (memory, compute, whole) in pod.assignment.placement.held_per_card().items():
            m, c, w = out.get(card, (0, 0, False))
            out[card] = (m + memory, c + compute, w or whole)
    return out
