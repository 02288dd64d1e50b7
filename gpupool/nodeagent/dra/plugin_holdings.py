"""The device plugin's pods on this node, for the DRA driver's check at prepare.

The DRA allocator in kube-scheduler does not see extended-resource pods (the extender books them,
and the extender books claims too: docs/dra.md, "One ledger"), so it can put a claim on a card such
pods fill. The DRA driver refuses such a claim at prepare, with the reason on the pod, rather than
over-commit the card: it claims these pods' assignments on a one-node ledger and asks the core's
card rule, the extender's (:func:`gpupool.nodeagent.schedule_check.node_ledger`).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.nodeagent.types import PodView


def plugin_pods(node: str, pods: Iterable[PodView]) -> list[PodView]:
    """The pods of ``pods`` (those kubelet lists) that hold a grant on ``node`` now: not ended, with
    an assignment that places them here."""
    return [pod for pod in pods if not pod.terminated and pod.assignment is not None
            and pod.assignment.placement.node in ("", node)]
