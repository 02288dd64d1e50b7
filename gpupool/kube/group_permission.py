"""Who may group what (seed 002's permission filtering): a user may group only the nodes, and the
GPUs on them, that the user may modify.

Kubernetes has no object per GPU: a node's GPUs are published on its Node object (the node agent's
inventory annotation), so "may modify a GPU" is "may modify its Node". The question is the
apiserver's, asked with a ``SubjectAccessReview`` (``update`` or ``patch`` on ``nodes``, by name),
so RBAC, webhooks or any authorizer the cluster runs decide, never a copy of their rules here.

:func:`refusal` checks one group and is what a validating admission webhook can call (it has the
requester's user and groups in its ``AdmissionReview``); :func:`permitted_nodes` filters the node
list before automatic grouping (seed 002 filters before it groups).
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
        review = authorization_api.create_subject_access_review({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": requester.user, "groups": list(requester.groups),
                     "resourceAttributes": {"verb": verb, "group": "", "resource": "nodes", "name": node}}})
        return bool(review.status.allowed)

    def may_modify(node: str) -> bool:
        if node not in answers:
            answers[node] = any(allowed(verb, node) for verb in MODIFY_VERBS)
        return answers[node]

    return may_modify


def forbidden_nodes(group: ResourceGroup, may_modify: MayModify) -> tuple[str, ...]:
    """The nodes of ``group`` the user may not modify, in the group's order."""
    return tuple(node.name for node in group.nodes if not may_modify(node.name))


def refusal(group: ResourceGroup, who: str, may_modify: MayModify) -> str | None:
    """Why ``who`` may not create or change ``group`` (None: they may), naming the nodes."""
    forbidden = forbidden_nodes(group, may_modify)
    if not forbidden:
        return None
    return (f"ResourceGroup {group.name}: {who} may not modify node(s) {_listed(forbidden)} "
            f"({' or '.join(MODIFY_VERBS)} on nodes), so may not group them or their GPUs")


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
