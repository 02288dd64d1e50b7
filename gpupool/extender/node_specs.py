"""Node objects from the watch → the core's :class:`NodeSpec`, translated only when it matters.

Why a memo: node status heartbeats arrive every few seconds per node; re-validating the inventory
JSON of 5,000 nodes on each would cost more than all the scheduling work. A node is translated
again only when a field its spec depends on changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpupool.api.names import CARRIED_BY, SERVABLE, ResourceNames
from gpupool.core.model import NodeSpec
from gpupool.kube.translate import node_spec


class NodeSpecs:
    """The last translated spec of every node, keyed by a fingerprint of the fields it reads."""

    def __init__(self, names: ResourceNames) -> None:
        self.names = names
        self._memo: dict[str, tuple[str, NodeSpec]] = {}

    def spec_for(self, raw: Mapping[str, Any]) -> NodeSpec:
        """The node's spec; raises :class:`gpupool.kube.translate.TranslationError` for a broken one."""
        meta = raw.get("metadata") or {}
        status = raw.get("status") or {}
        name = str(meta.get("name") or "")
        inventory = (meta.get("annotations") or {}).get(self.names.inventory)
        fingerprint = json.dumps([inventory, meta.get("labels"), status.get("capacity"),
                                  status.get("allocatable")], sort_keys=True)
        memo = self._memo.get(name)
        if memo is not None and memo[0] == fingerprint:
            return memo[1]
        spec = node_spec(raw, self.names)
        self._memo[name] = (fingerprint, spec)
        return spec

    def forget(self, name: str) -> None:
        """Drop the memo of a deleted node."""
        self._memo.pop(name, None)


def node_name(raw: Mapping[str, Any]) -> str:
    """``metadata.name`` of a node object ("" when missing)."""
    return str(((raw.get("metadata") or {}).get("name")) or "")


def served_aliases(node: Mapping[str, Any]) -> frozenset[str]:
    """The foreign aliases a node's kubelet advertises (its node agent serves them as devices).

    kubelet lists a device plugin's resource in the node's capacity and allocatable once the plugin
    registered (with 0 while every card is unhealthy, which still means "served": the card check
    then refuses with the better reason).
    """
    status = node.get("status") or {}
    listed = {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}
    return frozenset(name for name in listed if name in SERVABLE or name in CARRIED_BY)


def has_soft_taint(node: Mapping[str, Any]) -> bool:
    """Whether the node has a ``PreferNoSchedule`` taint: kube-scheduler's TaintToleration score
    steers pods that do not tolerate it elsewhere, so the filter leaves the choice among the best
    nodes to kube-scheduler when one of them has such a taint (docs/extender.md, "One best node")."""
    spec = node.get("spec")
    taints = spec.get("taints") if isinstance(spec, Mapping) else None
    return isinstance(taints, list) and any(
        isinstance(t, Mapping) and t.get("effect") == "PreferNoSchedule" for t in taints)
