"""``kubectl gpupool why POD``: why a pod fits on no node, in the sentences the extender's filter gives.

The filter's rules are applied by the code the extender runs, in the order its filter applies them
(``gpupool.extender.service``): the pod's admission under its group, quotas and card controls
(:class:`gpupool.kube.tenancy_layers.Admissions`: a refusal everywhere, or the layers that leave
nodes without a card: outside the group, outside a quota's pools, no GPU its annotations allow,
no room left in a quota on the node's GPU model), the request no node could ever hold
(:func:`gpupool.core.feasibility.request_problem`), nodes gpupool refuses (an unreadable inventory
or claim, a lapsed agent Lease: :mod:`gpupool.kubectl.rules`), nodes that do not serve a foreign
alias the pod uses (:func:`gpupool.kube.refusal_texts.alias_problem`), then CPU, memory and cards
under the placement policy (:meth:`gpupool.core.scheduler.Scheduler.explain`), with a note on the
cards lent there. Nodes are grouped by the head of their sentence (up to its first ``:`` or ``;``):
"no single card has 8192 MiB free" is one group whatever each node's largest free slice is; the
full sentence is kept per node.

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
from gpupool.kube.refusal_texts import alias_problem
from gpupool.kube.tenancy import PodTenancy
from gpupool.kube.tenancy_layers import Admission, Admissions
from gpupool.kubectl.rules import ClusterRules
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
    policy: str = DEFAULT_POLICY
    """The placement policy the fits were scored by (the pod's own choice of binpack or spread
    applies within it, as in the extender)."""
    notes: tuple[str, ...] = ()
    """What could not be read or judged (:class:`ClusterRules`), then each node whose agent's start-up
    checks were not all ok (``gpupool.io/agent-checks``), a probable cause whether it was refused or not."""


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


def explain(snapshot: ClusterSnapshot, request: PodRequest, aliases: frozenset[str] = frozenset(), *,
            policy: str = DEFAULT_POLICY, best: int = BEST_NODES, rules: ClusterRules | None = None,
            tenant: PodTenancy | None = None) -> Explanation:
    """Where ``request`` fits in ``snapshot`` now, and why not everywhere else, by the filter's rules
    (``rules``: tenancy, agent Leases, loans; ``tenant``: the pod's namespace, group and card
    controls, read with the same names as ``rules.book``).

    The scheduler's filter is exact (the vectorised masks for one GPU container, the card choice
    itself for several), so every node it passes can take the pod."""
    rules = rules or ClusterRules()
    state = snapshot.state
    present = [row for row in range(state.size) if state.present[row]]
    names = [state.specs[row].name for row in present]

    checks = tuple(f"node {name}: its agent's start-up checks were not all ok, a probable cause of trouble "
                   f"there: {snapshot.agent_checks[name]}" for name in sorted(names) if name in snapshot.agent_checks)

    def answer(fits: tuple[tuple[str, float], ...], failed: dict[str, str], everywhere: str | None) -> Explanation:
        return Explanation(request.key, len(names), fits, group_reasons(failed), everywhere, policy,
                           rules.notes + checks)

    admission = (Admissions(rules.book).admit(state, request, tenant) if rules.book is not None
                 else Admission(request))
    everywhere = admission.error or request_problem(state, admission.request)
    if everywhere is not None:
        return answer((), dict.fromkeys(names, everywhere), everywhere)
    rows = np.array(present, dtype=np.int64)
    name_array = np.array(names, dtype=object)
    usable = np.ones(len(rows), dtype=bool)
    failed: dict[str, str] = {}
    refused = {**snapshot.node_problems, **rules.node_refusals} if request.wants_gpu else {}
    for i, name in enumerate(names):
        problem = refused.get(name)
        if problem is not None:
            usable[i] = False
            failed[name] = problem
    for outside in admission.refuse_nodes(state, rows, usable, name_array):  # group, pools, pins, quota models
        failed.update(outside)
    for i in np.flatnonzero(usable).tolist():
        problem = alias_problem(aliases, snapshot.listed.get(names[i], frozenset()))
        if problem is not None:
            usable[i] = False
            failed[names[i]] = problem
    profile = WorkloadProfile.from_pods(snapshot.requests) if snapshot.requests else None
    scheduler = Scheduler(state, make_policy(policy), profile=profile)
    candidates = rows[usable]
    ok, scores = scheduler.filter_and_score(admission.request, candidates)
    rejected = np.setdiff1d(candidates, ok)
    explained = scheduler.explain(admission.request, rejected)
    for row in rejected.tolist():
        name = state.specs[row].name
        failed[name] = explained.get(name, DOES_NOT_FIT) + rules.loans.get(name, "")
    score_of = dict(zip(ok.tolist(), scores.tolist(), strict=True))
    fits = tuple((state.specs[row].name, float(score_of[row])) for row in scheduler.pick(ok, scores)[:best].tolist())
    return answer(fits, failed, None)


# ------------------------------------------------------------------------------------- rendering
def why_text(answer: Explanation, *, examples: int, scheduler_says: str | None = None) -> str:
    """The human answer: the verdict, then each group with up to ``examples`` nodes (0: all)."""
    lines: list[str] = []
    if answer.fits:
        lines.append(f"pod {answer.pod} fits on {_count(answer.nodes_checked - _refused(answer), 'node')} "
                     f"of {answer.nodes_checked} by gpupool's booking; best by policy {answer.policy}:")
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
    lines.extend(f"note: {note}" for note in answer.notes)
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
        "policy": answer.policy,
        "notes": list(answer.notes),
        "schedulerSays": scheduler_says,
    }


def _refused(answer: Explanation) -> int:
    return sum(len(g.nodes) for g in answer.groups)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"
