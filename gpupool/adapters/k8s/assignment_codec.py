"""A tolerant reader of the extender's pod annotation ``gpupool.io/assignment-v1``.

The extender owns the writer (branch ``extender``); until both are merged this decoder accepts the
agreed shape and the obvious spellings of it, and rejects anything it cannot read exactly, with a
message naming the field. Accepted::

    {"version": 1, "node": "n1", "time": "...",
     "containers": [{"name": "c", "init": false,
                     "cards": [{"index": 0, "uuid": "GPU-..", "memoryMiB": 4096,
                                "compute": 300, "exclusive": false}]}]}

``containers`` may also be an object keyed by container name. ``compute`` is per-mille of a card
(the core's unit); ``computePercent``/``corePercent`` in percent are converted. Memory may be
``memoryMiB``, ``memory_mib`` or ``memory``.
"""

from __future__ import annotations

import json
from typing import Any

from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.services.node_types import NodeAssignment


class AssignmentFormatError(ValueError):
    """The annotation cannot be read exactly; the node refuses to guess."""


def _first(raw: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in raw:
            return raw[name]
    raise KeyError(names[0])


def _card(raw: Any, where: str) -> tuple[CardSlice, str]:
    if not isinstance(raw, dict):
        raise AssignmentFormatError(f"{where}: a card must be an object")
    try:
        index = int(_first(raw, "index", "card"))
        memory = int(_first(raw, "memoryMiB", "memory_mib", "memory"))
        if "compute" in raw:
            compute = int(raw["compute"])
        else:
            compute = int(_first(raw, "computePercent", "corePercent", "core")) * 10
    except (KeyError, TypeError, ValueError) as exc:
        raise AssignmentFormatError(f"{where}: missing or bad field {exc}") from exc
    slice_ = CardSlice(card=index, memory_mib=memory, compute=compute,
                       exclusive=bool(raw.get("exclusive", False)))
    return slice_, str(raw.get("uuid", ""))


def decode_assignment(text: str, pod_key: str) -> NodeAssignment:
    """Parse the annotation of pod ``pod_key`` into the core's :class:`Placement`."""
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AssignmentFormatError(f"{pod_key}: assignment-v1 is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise AssignmentFormatError(f"{pod_key}: assignment-v1 must be an object")
    if doc.get("version", 1) != 1:
        raise AssignmentFormatError(f"{pod_key}: assignment version {doc.get('version')} is not 1")
    raw_containers = doc.get("containers")
    if isinstance(raw_containers, dict):
        items = [dict(v, name=k) if isinstance(v, dict) else {"name": k, "cards": v}
                 for k, v in raw_containers.items()]
    elif isinstance(raw_containers, list):
        items = raw_containers
    else:
        raise AssignmentFormatError(f"{pod_key}: assignment-v1 needs 'containers'")
    uuids: dict[int, str] = {}
    assignments = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "name" not in item:
            raise AssignmentFormatError(f"{pod_key}: containers[{i}] needs a name")
        raw_cards = item.get("cards", item.get("slices"))
        if not isinstance(raw_cards, list):
            raise AssignmentFormatError(f"{pod_key}: container {item['name']}: 'cards' must be a list")
        slices = []
        for j, raw in enumerate(raw_cards):
            slice_, uuid = _card(raw, f"{pod_key}: container {item['name']} card {j}")
            slices.append(slice_)
            if uuid:
                uuids[slice_.card] = uuid
        assignments.append(ContainerAssignment(container=str(item["name"]), slices=tuple(slices),
                                               init=bool(item.get("init", False))))
    placement = Placement(pod_key=pod_key, node=str(doc.get("node", "")), cpu_milli=0, memory_mib=0,
                          containers=tuple(assignments))
    return NodeAssignment(placement=placement, uuids=uuids, time=str(doc.get("time", "")))
