"""``kubectl gpupool why POD``: why a pod fits on no node, in the sentences the extender's filter gives.

The reasons come from the core (:func:`gpupool.core.feasibility.request_problem` for a pod no node
could ever hold, :meth:`gpupool.core.scheduler.Scheduler.explain` per node otherwise), asked in the
order the extender's filter asks them: nodes gpupool refuses (an unreadable inventory or claim),
nodes that do not serve a foreign alias the pod uses, then CPU, memory and cards. Nodes are grouped
by the head of their sentence (up to its first ``:`` or ``;``): "no single card has 8192 MiB free"
is one group whatever each node's largest free slice is; the full sentence is kept per node.

gpupool's view only: node selectors, taints and affinity are kube-scheduler's (the pod's
``PodScheduled`` condition, shown beside, carries its last word).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpupool.core.feasibility import request_problem
from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import PodRequest
from gpupool.core.policies import DEFAULT_POLICY, make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.kubectl.snapshot import ClusterSnapshot

BEST_NODES = 3
"""How many fitting nodes ``why`` names, best first by the policy's score."""

DOES_NOT_FIT = "does not fit"
"""The extender's words for a node the core rejects without a sentence of its own."""

_HEAD = re.compile(r"[:;]")


@dataclass(frozen=True)
class ReasonGroup:
    """Nodes refused for the same reason: the sentence's head, and each node's full sentence."""

    head: str
    nodes: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Explanation:
    """The answer for one pod. ``fits``: nodes that can hold it now, best first, with their scores;
    ``groups``: the other nodes by reason, largest group first; ``everywhere``: a reason that holds
    for every node (the request exceeds any node of the cluster), or None."""

    pod: str
    nodes_checked: int
    fits: tuple[tuple[str, float], ...]
    groups: tuple[ReasonGroup, ...]
    everywhere: str | None = None


def head(reason: str) -> str:
    """The part of a reason that nodes share: up to its first ``:`` or ``;``."""
    return _HEAD.split(reason, maxsplit=1)[0].strip()


def group_reasons(reasons: Mapping[str, str]) -> tuple[ReasonGroup, ...]:
    """Nodes by the head of their reason; largest group first, then by head; nodes by name."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for node, reason in reasons.items():
        groups.setdefault(head(reason), []).append((node, reason))
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    return tuple(ReasonGroup(h, tuple(sorted(members))) for h, members in ordered)


def alias_problem(wanted: frozenset[str], listed: frozenset[str]) -> str | None:
    """Why a node cannot take the foreign aliases a pod uses (kubelet would start the pod without
    the grant of a resource its node does not list), or None."""
    missing = sorted(wanted - listed)
    if not missing:
        return None
    return f"node does not serve {', '.join(missing)} (its gpupool node agent does not advertise it)"


def explain(snapshot: ClusterSnapshot, request: PodRequest, aliases: frozenset[str] = frozenset(), *,
            policy: str = DEFAULT_POLICY, best: int = BEST_NODES) -> Explanation:
    """Where ``request`` fits in ``snapshot`` now, and why not everywhere else.

    The scheduler's filter is exact (the vectorised masks for one GPU container, the card choice
    itself for several), so every node it passes can take the pod."""
    state = snapshot.state
    present = [row for row in range(state.size) if state.present[row]]
    names = [state.specs[row].name for row in present]
    everywhere = request_problem(state, request)
    if everywhere is not None:
        return Explanation(request.key, len(names), (), group_reasons(dict.fromkeys(names, everywhere)), everywhere)
    failed: dict[str, str] = {}
    candidates: list[int] = []
    for row, name in zip(present, names, strict=True):
        refused = snapshot.node_problems.get(name) if request.wants_gpu else None
        refused = refused or alias_problem(aliases, snapshot.listed.get(name, frozenset()))
        if refused is not None:
            failed[name] = refused
        else:
            candidates.append(row)
    profile = WorkloadProfile.from_pods(snapshot.requests) if snapshot.requests else None
    scheduler = Scheduler(state, make_policy(policy), profile=profile)
    rows = np.array(candidates, dtype=np.int64)
    ok, scores = scheduler.filter_and_score(request, rows)
    rejected = np.setdiff1d(rows, ok)
    explained = scheduler.explain(request, rejected)
    for row in rejected.tolist():
        name = state.specs[row].name
        failed[name] = explained.get(name, DOES_NOT_FIT)
    score_of = dict(zip(ok.tolist(), scores.tolist(), strict=True))
    fits = tuple((state.specs[row].name, float(score_of[row])) for row in scheduler.pick(ok, scores)[:best].tolist())
    return Explanation(request.key, len(names), fits, group_reasons(failed))


# ------------------------------------------------------------------------------------- rendering
def why_text(answer: Explanation, *, examples: int, scheduler_says: str | None = None) -> str:
    """The human answer: the verdict, then each group with up to ``examples`` nodes (0: all)."""
    lines: list[str] = []
    if answer.fits:
        lines.append(f"pod {answer.pod} fits on {_count(answer.nodes_checked - _refused(answer), 'node')} "
                     f"of {answer.nodes_checked} by gpupool's booking; best by the default policy:")
        lines.extend(f"  {name}  (score {score:.3g})" for name, score in answer.fits)
    elif answer.everywhere is not None:
        lines.append(f"pod {answer.pod} fits on no node: {answer.everywhere}")
    else:
        lines.append(f"pod {answer.pod} fits on none of {_count(answer.nodes_checked, 'node')}:")
    if answer.groups and answer.everywhere is None:
        if answer.fits:
            lines.append("other nodes:")
        for group in answer.groups:
            lines.append(f"  {_count(len(group.nodes), 'node')}: {group.head}")
            shown = group.nodes if examples <= 0 else group.nodes[:examples]
            lines.extend(f"      {node}: {reason}" for node, reason in shown)
            if len(shown) < len(group.nodes):
                lines.append(f"      ... and {len(group.nodes) - len(shown)} more")
    if scheduler_says:
        lines.append(f"kube-scheduler says: {scheduler_says}")
    return "\n".join(lines)


def why_json(answer: Explanation, scheduler_says: str | None = None) -> dict[str, Any]:
    """The same answer for scripts (``-o json``): every node of every group."""
    return {
        "pod": answer.pod,
        "nodesChecked": answer.nodes_checked,
        "fits": [{"node": name, "score": score} for name, score in answer.fits],
        "everywhere": answer.everywhere,
        "groups": [{"reason": g.head, "count": len(g.nodes),
                    "nodes": [{"node": node, "reason": reason} for node, reason in g.nodes]}
                   for g in answer.groups],
        "schedulerSays": scheduler_says,
    }


def _refused(answer: Explanation) -> int:
    return sum(len(g.nodes) for g in answer.groups)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"
