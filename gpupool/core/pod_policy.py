"""A pod's own placement choice: how to pick its node and how to pick its cards.

HAMi users steer single pods with ``hami.io/node-scheduler-policy`` and
``hami.io/gpu-scheduler-policy`` (binpack or spread) while the cluster keeps its default policy;
this is the core's form of that choice, read by :class:`gpupool.core.scheduler.Scheduler` per
request. It lives apart from :mod:`gpupool.core.policies` because the request type carries it and
the policies import the request type.
"""

from __future__ import annotations

from dataclasses import dataclass

NODE_CHOICES = ("binpack", "spread")
"""binpack: fill the nodes that are fullest already; spread: prefer the node with the most free GPU."""

CARD_CHOICES = ("binpack", "spread")
"""binpack: a slice goes to the fullest card that fits; spread: to the emptiest."""


@dataclass(frozen=True)
class PolicyChoice:
    """``node`` / ``card``: one of the choices above, or None to keep the cluster's policy for it."""

    node: str | None = None
    card: str | None = None

    def __post_init__(self) -> None:
        for what, value, allowed in (("node", self.node, NODE_CHOICES), ("card", self.card, CARD_CHOICES)):
            if value is not None and value not in allowed:
                raise ValueError(f"{what} policy must be one of {', '.join(allowed)}, got {value!r}")

    @property
    def is_default(self) -> bool:
        return self.node is None and self.card is None
