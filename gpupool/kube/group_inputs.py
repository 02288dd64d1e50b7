"""The inputs of ``gpupool groups``: Node objects (from the API or a ``kubectl get nodes -o yaml``
file), a demand file and ResourceGroup manifests, each read with a clear error naming what is wrong.

Nodes are translated exactly as the extender translates them (:func:`gpupool.kube.translate.node_spec`,
the node agent's inventory annotation or the capacity fallback), so a proposal names the GPUs the
extender will see.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.api.names import ResourceNames
from gpupool.api.tenancy import ResourceGroup, TenancyError, decode_group, name_field
from gpupool.core.model import NodeSpec
from gpupool.kube.group_proposal import Demand
from gpupool.kube.translate import TranslationError, node_spec

MAX_DEMAND_GPUS = 1_000_000
"""Most GPUs one team may expect (more than any cluster has: a typo)."""


class InputError(ValueError):
    """An input file that cannot be read; the message names the entry and the field."""


def objects(documents: Iterable[Any], kind: str) -> list[Mapping[str, Any]]:
    """The objects of ``kind`` in YAML documents, ``List`` and ``<Kind>List`` wrappers opened;
    other kinds are skipped (a file may hold more than the command reads)."""
    found: list[Mapping[str, Any]] = []
    for doc in documents:
        if not isinstance(doc, Mapping):
            continue
        if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
            found.extend(objects(doc["items"], kind))
        elif doc.get("kind") == kind:
            found.append(doc)
    return found


def node_specs(nodes: Iterable[Mapping[str, Any]], names: ResourceNames) -> tuple[list[NodeSpec], list[str]]:
    """``(specs, problems)``: a node whose inventory cannot be read is left out and its problem kept,
    as the extender keeps such a node without cards."""
    specs: list[NodeSpec] = []
    problems: list[str] = []
    for raw in nodes:
        try:
            specs.append(node_spec(raw, names))
        except (TranslationError, ValueError) as exc:
            problems.append(f"left out: {exc}")
    return specs, problems


def demands(data: Any) -> tuple[Demand, ...]:
    """A demand file: ``team: GPUs`` or ``team: {gpus: N, model: M, namespaces: [..]}``."""
    if not isinstance(data, Mapping) or not data:
        raise InputError("demand file: expected a mapping of team -> GPUs (or {gpus, model, namespaces})")
    found = []
    for team, raw in data.items():
        where = f"demand file: team {team!s}"
        try:
            name_field(team, where)
        except TenancyError as exc:
            raise InputError(str(exc)) from None
        entry = raw if isinstance(raw, Mapping) else {"gpus": raw}
        unknown = set(entry) - {"gpus", "model", "namespaces"}
        if unknown:
            raise InputError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        gpus = entry.get("gpus")
        if type(gpus) is not int or not 1 <= gpus <= MAX_DEMAND_GPUS:
            raise InputError(f"{where}: gpus must be a whole number 1..{MAX_DEMAND_GPUS}, got {gpus!r}")
        model = entry.get("model", "")
        spaces = entry.get("namespaces", [])
        if not isinstance(spaces, list):
            raise InputError(f"{where}: namespaces must be a list")
        try:
            model = name_field(model, f"{where}: model") if model else ""
            namespaces = tuple(name_field(ns, f"{where}: namespaces") for ns in spaces)
        except TenancyError as exc:
            raise InputError(str(exc)) from None
        found.append(Demand(team, gpus, model, namespaces))
    return tuple(found)


def groups(documents: Iterable[Any]) -> list[ResourceGroup]:
    """The ResourceGroups of manifests, decoded by the extender's codec (its error names the field)."""
    found = objects(documents, "ResourceGroup")
    if not found:
        raise InputError("no ResourceGroup in the file")
    try:
        return [decode_group(obj) for obj in found]
    except TenancyError as exc:
        raise InputError(str(exc)) from None
