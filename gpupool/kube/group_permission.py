"""Who may group what (seed 002's permission filtering): a user may group only the nodes, and the
GPUs on them, that the user may modify.

Kubernetes has no object per GPU: a node's GPUs are published on its Node object (the node agent's
inventory annotation), so "may modify a GPU" is "may modify its Node". The question is the
apiserver's, asked with a ``SubjectAccessReview`` (``update`` or ``patch`` on ``nodes``, by name),
so RBAC, webhooks or any authorizer the cluster runs decide, never a copy of their rules here.

:func:`refusal` checks one group, or one change of a group (``before``: the nodes it leaves are
regrouped too), and is the one rule behind both ``gpupool groups check`` and the extender's
validating webhook on ResourceGroup writes (which asks about the requester of the
``AdmissionReview``); :func:`permitted_nodes` filters the node list before automatic grouping (seed
002 filters before it groups).

Cost: one review per verb without a node name first (RBAC allows a nameless request only through a
rule that names no node, i.e. one that covers every node), so a cluster admin costs two reviews
whatever the group's size; otherwise one or two per node, each answer remembered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.api.tenancy import ResourceGroup

MODIFY_VERBS = ("update", "patch")
"""Either one lets a user change a Node, hence the GPUs it carries."""

MAX_NAMED = 20
"""Nodes named in a refusal; more are counted (a reason stays readable and fits an event)."""

EVERY_NODE = ""
"""The review without a name: allowed only where the user may modify every node."""

MayModify = Callable[[str], bool]
"""``may_modify(node_name)``: whether the user in question may modify that Node."""


@dataclass(frozen=True)
class Requester:
    """The user whose permission is asked, as an ``AdmissionReview`` or ``--as-user`` names them."""

    user: str
    groups: tuple[str, ...] = ()


def sar_may_modify(authorization_api: Any, requester: Requester) -> MayModify:
    """A :data:`MayModify` asking the apiserver (``kubernetes.client.AuthorizationV1Api``); the
    answers are remembered for the caller's lifetime (one command, one admission request)."""
    answers: dict[str, bool] = {}

    def allowed(verb: str, node: str) -> bool:
        attributes = {"verb": verb, "group": "", "resource": "nodes"}
        if node:
            attributes["name"] = node
        review = authorization_api.create_subject_access_review({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": requester.user, "groups": list(requester.groups), "resourceAttributes": attributes}})
        return bool(review.status.allowed)

    def may_modify(node: str) -> bool:
        if EVERY_NODE not in answers:
            answers[EVERY_NODE] = any(allowed(verb, EVERY_NODE) for verb in MODIFY_VERBS)
        if answers[EVERY_NODE]:
            return True
        if node not in answers:
            answers[node] = any(allowed(verb, node) for verb in MODIFY_VERBS)
        return answers[node]

    return may_modify


def touched_nodes(group: ResourceGroup | None, before: ResourceGroup | None = None) -> tuple[str, ...]:
    """The nodes a write of ``group`` regroups: every node it names, then those ``before`` named
    and it no longer does (their GPUs leave the group: an unshared group's reservation ends)."""
    named = [node.name for node in group.nodes] if group is not None else []
    kept = set(named)
    left = [node.name for node in before.nodes if node.name not in kept] if before is not None else []
    return (*named, *left)


def forbidden_nodes(group: ResourceGroup | None, may_modify: MayModify,
                    before: ResourceGroup | None = None) -> tuple[str, ...]:
    """The nodes of :func:`touched_nodes` the user may not modify, in that order."""
    return tuple(name for name in touched_nodes(group, before) if not may_modify(name))


def refusal(group: ResourceGroup | None, who: str, may_modify: MayModify,
            before: ResourceGroup | None = None) -> str | None:
    """Why ``who`` may not write ``group`` (None: they may), naming the nodes: a create
    (``group`` alone), an update (both) or a delete (``before`` alone). Every node the group names
    before or after counts: changing only its subjects or ``shared`` changes who gets those GPUs."""
    forbidden = forbidden_nodes(group, may_modify, before)
    if not forbidden:
        return None
    subject = group if group is not None else before
    assert subject is not None  # forbidden nodes come from one of them
    verb = "group them or their GPUs" if before is None else "group or ungroup them or their GPUs"
    return (f"ResourceGroup {subject.name}: {who} may not modify node(s) {_listed(forbidden)} "
            f"({' or '.join(MODIFY_VERBS)} on nodes), so may not {verb}")


def permitted_nodes(names: Iterable[str], may_modify: MayModify) -> tuple[list[str], list[str]]:
    """``(permitted, refused)`` node names, each in the given order."""
    permitted: list[str] = []
    refused: list[str] = []
    for name in names:
        (permitted if may_modify(name) else refused).append(name)
    return permitted, refused


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_NAMED])
    return shown if len(names) <= MAX_NAMED else f"{shown} and {len(names) - MAX_NAMED} more"
