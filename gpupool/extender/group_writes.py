"""Admission of ResourceGroup writes by the requester's permissions (seed 002: a user may group only
the nodes, and the GPUs on them, that the user may modify).

The rule is :func:`gpupool.kube.group_permission.refusal`, the one ``gpupool groups check`` runs,
asked about the ``AdmissionReview``'s ``userInfo`` with SubjectAccessReviews: a create is judged on
the nodes the group names, an update on those it names before and after (changing only ``shared``
or the subjects changes who gets those GPUs; a node dropped is ungrouped), a delete on those it
named. The group is read with the extender's codec: one it could not read is refused with the field
named (the CRD's schema refuses most such writes first).

Each review is an API call (two per node at most, two in all for a user who may modify every node),
so the verdict runs off the event loop (:mod:`gpupool.extender.http.admission_review`), and only
for these rare admin writes. The extender's ServiceAccount needs ``create`` on
``subjectaccessreviews`` (deploy/kustomize/components/quota-webhook).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpupool.api.tenancy import GroupNode, ResourceGroup, TenancyError, decode_group
from gpupool.extender.admission import ALLOWED, Verdict
from gpupool.kube.group_permission import MayModify, Requester, refusal, sar_may_modify

OPERATIONS = ("CREATE", "UPDATE", "DELETE")
Permissions = Callable[[Requester], MayModify]
"""``permissions(requester)``: whether that requester may modify a node, asked of the apiserver."""


def sar_permissions(authorization_api: Any) -> Permissions:
    """:data:`Permissions` through ``kubernetes.client.AuthorizationV1Api`` (answers remembered per
    request only: RBAC may change between two writes)."""
    return lambda requester: sar_may_modify(authorization_api, requester)


class GroupWriteAdmission:
    """Judges a create, update or delete of a ResourceGroup by its requester."""

    def __init__(self, permissions: Permissions) -> None:
        self.permissions = permissions

    def review(self, operation: str, obj: Mapping[str, Any] | None, old: Mapping[str, Any] | None,
               user: str, groups: tuple[str, ...]) -> Verdict:
        """The verdict on ``operation`` of ``obj`` (``old``: the stored group; None on a create)."""
        if operation not in OPERATIONS:
            return ALLOWED
        try:
            group = decode_group(obj) if operation != "DELETE" and obj is not None else None
        except TenancyError as exc:
            return Verdict(False, f"{exc} (gpupool could not read this ResourceGroup)")
        before = _stored(old) if operation != "CREATE" else None
        if group is None and before is None:
            return ALLOWED
        reason = refusal(group, user, self.permissions(Requester(user, groups)), before=before)
        return ALLOWED if reason is None else Verdict(False, reason)


def _stored(old: Mapping[str, Any] | None) -> ResourceGroup | None:
    """The stored group; one the codec cannot read (stored before the CRD's checks) counts by the
    nodes it names, as far as they can be read."""
    if old is None:
        return None
    try:
        return decode_group(old)
    except TenancyError:
        pass
    spec = old.get("spec")
    raw_nodes = spec.get("nodes") if isinstance(spec, Mapping) else None
    names: list[str] = []
    for entry in raw_nodes if isinstance(raw_nodes, list) else []:
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if isinstance(name, str):
            names.append(name)
    meta = old.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return ResourceGroup(str(meta.get("name") or "?"), tuple(GroupNode(n, None) for n in dict.fromkeys(names)))
