"""The pod annotation ``gpupool.io/allocated-v1``: what the node actually handed each container.

Written by the node agent after Allocate (and corrected by reconciliation from kubelet's
PodResources), read by the extender's ledger in preference to ``assignment-v1``: it is the truth
about which cards a running container uses. Schema::

    {"version": 1, "node": "n1", "time": "2024-..Z",
     "containers": [{"name": "c", "init": false,
                     "cards": [{"index": 0, "uuid": "GPU-..", "memoryMiB": 4096, "compute": 300}],
                     "resources": {"gpupool.io/gpu-mem": 16}}]}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.core.model import CardSlice
from gpupool.services.node_agent import ServedContainer


@dataclass(frozen=True)
class AllocatedContainer:
    """One container's cards as served, and how many kubelet devices of each resource it holds."""

    name: str
    init: bool
    slices: tuple[CardSlice, ...]
    uuids: tuple[str, ...]
    resources: Mapping[str, int]


def encode_allocated(node: str, time: str, containers: list[AllocatedContainer]) -> str:
    """Serialise (containers sorted by name, so rewrites are stable)."""
    doc = {
        "version": 1, "node": node, "time": time,
        "containers": [
            {"name": c.name, "init": c.init,
             "cards": [{"index": s.card, "uuid": u, "memoryMiB": s.memory_mib, "compute": s.compute}
                       for s, u in zip(c.slices, c.uuids, strict=True)],
             "resources": dict(sorted(c.resources.items()))}
            for c in sorted(containers, key=lambda c: c.name)
        ],
    }
    return json.dumps(doc, separators=(",", ":"))


def decode_allocated(text: str) -> list[AllocatedContainer]:
    """Parse; ``ValueError`` with the reason when malformed."""
    doc: Any = json.loads(text)
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise ValueError("allocated-v1 needs an object with version 1")
    out = []
    for raw in doc.get("containers", []):
        cards = raw.get("cards", [])
        out.append(AllocatedContainer(
            name=str(raw["name"]), init=bool(raw.get("init", False)),
            slices=tuple(CardSlice(card=int(c["index"]), memory_mib=int(c["memoryMiB"]),
                                   compute=int(c["compute"])) for c in cards),
            uuids=tuple(str(c.get("uuid", "")) for c in cards),
            resources={str(k): int(v) for k, v in raw.get("resources", {}).items()}))
    return out


def encode_served(node: str, time: str, served: list[ServedContainer]) -> str:
    """The node agent's encoder: its served containers as ``allocated-v1``."""
    return encode_allocated(node, time, [
        AllocatedContainer(name=c.name, init=c.init, slices=c.record.slices, uuids=c.record.uuids,
                           resources=dict(c.resources)) for c in served])
