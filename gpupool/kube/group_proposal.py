"""Proposed ``ResourceGroup`` objects from the cluster's GPU inventory (seed 002's automatic grouping).

Seed 002 groups nodes and the GPUs bound to them either by hand or automatically from "grouping
parameters": the GPUs' type (model) and/or the expected demand, and the requester then confirms or
edits the proposal. This module is the automatic part, pure: it takes the nodes' specs (as the
extender translates them, :func:`gpupool.kube.translate.node_spec`) and returns groups; the CLI
writes them as manifests for an admin to edit and ``kubectl apply``.

Three ways, combinable through :class:`ProposalRequest`:

* by model: one group per GPU model (``--by model``), ``shared: true`` so that pods without a group
  keep using the GPUs (a model group only narrows the pods that name it);
* by model cut in N (``--split N``): a model's GPUs in N groups whose sizes differ by at most one
  GPU, nodes kept whole where the sizes allow (walking nodes in name order, each cut splits at most
  one node);
* by demand (``--demand``): one unshared group per team, sized to the team's expected GPU count,
  best fit: the node whose free GPUs exceed the demand least takes it whole (fewest leftovers,
  seed 002's "remainder minus demand smallest"); a demand larger than every node takes the largest
  nodes first, and the rest again by best fit.

Only healthy GPUs are proposed. A node entry lists its GPUs by UUID unless the group takes every GPU
of the node (then it is listed by name alone, so that cards added later join the group).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.api.tenancy import API_VERSION, GroupNode, ResourceGroup, Subject, TenancyNames, decode_group
from gpupool.core.model import NodeSpec

MAX_SPLIT = 1_000
"""Most groups one model may be cut into (more is a typo: a cluster has fewer GPUs of a model)."""

_NAME_CHARS = re.compile(r"[^a-z0-9-]+")
MAX_NAME = 63
"""A DNS label's length: the longest group name derived from a model or a team."""


class ProposalError(ValueError):
    """A proposal that cannot be made (unknown model, not enough GPUs); the message says why."""


@dataclass(frozen=True)
class Demand:
    """One team's expected demand: ``gpus`` whole GPUs, of ``model`` ("" for any model), for the
    pods of ``namespaces`` (empty: a namespace named after the team)."""

    team: str
    gpus: int
    model: str = ""
    namespaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProposalRequest:
    """What to group by: ``by_model`` (one group per model, or ``split`` groups per model) and/or
    ``demands`` (one group per team; with ``by_model`` a demand without a model takes GPUs of a
    single model)."""

    by_model: bool = False
    split: int = 1
    demands: tuple[Demand, ...] = ()


@dataclass(frozen=True)
class _Gpu:
    node: str
    uuid: str
    model: str


def group_name(*parts: str) -> str:
    """A DNS-label group name from free text (``Tesla-T4`` -> ``tesla-t4``)."""
    text = _NAME_CHARS.sub("-", "-".join(parts).lower()).strip("-")
    return (text[:MAX_NAME].rstrip("-")) or "group"


def _healthy(nodes: Iterable[NodeSpec]) -> list[_Gpu]:
    return [_Gpu(node.name, card.uuid, card.model)
            for node in sorted(nodes, key=lambda n: n.name) for card in node.cards if card.healthy]


def _entries(gpus: Sequence[_Gpu], all_of: Mapping[str, int]) -> tuple[GroupNode, ...]:
    """Group the GPUs by node, in node order; a node whose every healthy GPU is taken is named alone."""
    by_node: dict[str, list[str]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, []).append(gpu.uuid)
    return tuple(GroupNode(node, None if len(uuids) == all_of[node] else frozenset(uuids))
                 for node, uuids in sorted(by_node.items()))


def _sizes(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _by_model(gpus: list[_Gpu], split: int, all_of: Mapping[str, int]) -> list[ResourceGroup]:
    models = sorted({g.model for g in gpus})
    groups = []
    for model in models:
        pool = [g for g in gpus if g.model == model]
        if split > len(pool):
            raise ProposalError(f"cannot cut the {len(pool)} GPU(s) of model {model} into {split} groups")
        start = 0
        for i, size in enumerate(_sizes(len(pool), split)):
            name = group_name("model", model) if split == 1 else group_name("model", model, str(i + 1))
            groups.append(ResourceGroup(name, _entries(pool[start:start + size], all_of), shared=True))
            start += size
    return groups


def _best_fit(free: dict[str, list[_Gpu]], wanted: int) -> list[_Gpu]:
    """Take ``wanted`` GPUs from ``free`` (node -> its free GPUs, consumed): best fit on one node,
    else the largest nodes first."""
    taken: list[_Gpu] = []
    while wanted > 0:
        fitting = [n for n, g in free.items() if len(g) >= wanted]
        if fitting:
            node = min(fitting, key=lambda n: (len(free[n]) - wanted, n))
            count = wanted
        else:
            node = min(free, key=lambda n: (-len(free[n]), n))
            count = len(free[node])
        taken.extend(free[node][:count])
        free[node] = free[node][count:]
        if not free[node]:
            del free[node]
        wanted -= count
    return taken


def _by_demand(gpus: list[_Gpu], demands: Sequence[Demand], one_model: bool,
               all_of: Mapping[str, int]) -> list[ResourceGroup]:
    left = list(gpus)
    groups = []
    for demand in sorted(demands, key=lambda d: (-d.gpus, d.team)):
        if demand.model:
            models = [demand.model]
        elif one_model:
            counts = {m: sum(1 for g in left if g.model == m) for m in {g.model for g in left}}
            fitting = [m for m, c in counts.items() if c >= demand.gpus]
            models = [min(fitting, key=lambda m: (counts[m] - demand.gpus, m))] if fitting else []
        else:
            models = sorted({g.model for g in left})
        pool = [g for g in left if g.model in models]
        if len(pool) < demand.gpus:
            kind = f"GPUs of model {demand.model}" if demand.model else (
                "GPUs of one model" if one_model else "GPUs")
            raise ProposalError(f"team {demand.team} expects {demand.gpus} {kind}; only "
                                f"{len(pool) if models else 0} left after the larger demands")
        free: dict[str, list[_Gpu]] = {}
        for gpu in pool:
            free.setdefault(gpu.node, []).append(gpu)
        taken = _best_fit(free, demand.gpus)
        chosen = {g.uuid for g in taken}
        left = [g for g in left if g.uuid not in chosen]
        namespaces = demand.namespaces or (demand.team,)
        groups.append(ResourceGroup(group_name(demand.team), _entries(taken, all_of), shared=False,
                                    subjects=tuple(Subject("Namespace", ns) for ns in namespaces)))
    return groups


def propose(nodes: Iterable[NodeSpec], request: ProposalRequest) -> list[ResourceGroup]:
    """The proposed groups, each checked by the extender's own codec (:func:`manifest` round trip)."""
    if not 1 <= request.split <= MAX_SPLIT:
        raise ProposalError(f"split must be 1..{MAX_SPLIT}, got {request.split}")
    if not request.by_model and not request.demands:
        raise ProposalError("nothing to group by: ask for groups by model and/or by demand")
    node_list = list(nodes)
    gpus = _healthy(node_list)
    all_of = {node.name: sum(1 for c in node.cards if c.healthy) for node in node_list}
    known = {g.model for g in gpus}
    for demand in request.demands:
        if demand.model and demand.model not in known:
            raise ProposalError(f"team {demand.team}: no healthy GPU of model {demand.model} "
                                f"(models: {', '.join(sorted(known)) or 'none'})")
    if request.demands:
        groups = _by_demand(gpus, request.demands, request.by_model, all_of)
    else:
        groups = _by_model(gpus, request.split, all_of)
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        raise ProposalError(f"two proposed groups would share a name: {', '.join(sorted(names))}")
    for group in groups:
        if decode_group(manifest(group)) != group:
            raise ProposalError(f"group {group.name} does not survive the ResourceGroup codec")
    return groups


DEFAULT_NAMES = TenancyNames()


def manifest(group: ResourceGroup, names: TenancyNames = DEFAULT_NAMES) -> dict[str, Any]:
    """The ``ResourceGroup`` object of ``group``, as ``kubectl apply`` takes it."""
    nodes: list[dict[str, Any]] = []
    for node in group.nodes:
        entry: dict[str, Any] = {"name": node.name}
        if node.gpus is not None:
            entry["gpus"] = sorted(node.gpus)
        nodes.append(entry)
    spec: dict[str, Any] = {"shared": group.shared, "nodes": nodes}
    if group.subjects:
        spec["subjects"] = [_subject(s) for s in group.subjects]
    return {"apiVersion": f"{names.api_group}/{API_VERSION}", "kind": "ResourceGroup",
            "metadata": {"name": group.name}, "spec": spec}


def _subject(subject: Subject) -> dict[str, str]:
    out = {"kind": subject.kind, "name": subject.name}
    if subject.namespace:
        out["namespace"] = subject.namespace
    return out
