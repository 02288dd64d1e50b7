"""Admission of a pod that names a resource group, by the group's subjects and the requester: User
and Group subjects match the identity that creates the pod or sets its group label (seed 002's
"permission filtering" of who may use a group), which a pod does not carry, so only this webhook,
reading the ``AdmissionReview``'s ``userInfo``, can match them.

The rule, one for every subject kind: a pod may name a group that has no subjects, or one of whose
Namespace or ServiceAccount subjects is the pod's own, or one of whose User or Group subjects is the
requester (its user name, or one of its groups). Judged when a pod naming a group is created and
when an update sets or changes its group label (``kubectl label`` on a pending pod); an update that
keeps the label is not judged again.

Why every pod naming a group is refused here when its subjects do not admit it, not only pods of
groups with User or Group subjects: the filter trusts a labelled pod of a group with User or Group
subjects (:attr:`gpupool.kube.tenancy_layers.Admissions.creators_checked`). If a pod left Pending under
a group without them were allowed here, adding a User subject later would let it in unchecked. For
the same reason a group that does not exist or cannot be read refuses the pod (create the group
first), and so does a cache that has not listed the groups yet (the client retries).

A pod admitted here keeps its group when the subjects are narrowed later, as a pod keeps running
when RBAC is narrowed; its Namespace and ServiceAccount are still matched at every filter unless the
group has User or Group subjects.

Reads only the extender's cache, under its lock: no API call per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.api.tenancy import ResourceGroup, TenancyNames
from gpupool.extender.admission import ALLOWED, Verdict
from gpupool.extender.ledger_reads import TenancyLedger

MAX_SHOWN = 10
"""Subjects named in a refusal; more are counted."""
NOT_SYNCED = ("gpupool: the extender has not listed the resource groups yet, so it cannot check who may use "
              "resource group {group}; retry in a moment")


def group_label(pod: Mapping[str, Any] | None, names: TenancyNames) -> str:
    """The group a pod's label names ("" for none or a value that is no string)."""
    if not isinstance(pod, Mapping):
        return ""
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    value = labels.get(names.group_label) if isinstance(labels, Mapping) else None
    return value.strip() if isinstance(value, str) else ""


def _service_account(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return "default"
    return str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")


class GroupSubjectAdmission:
    """Judges pods naming a resource group against its subjects and the requester."""

    def __init__(self, ledger: TenancyLedger, names: TenancyNames) -> None:
        self.ledger = ledger
        self.names = names

    def review(self, pod: Mapping[str, Any], old: Mapping[str, Any] | None, namespace: str, user: str,
               groups: tuple[str, ...]) -> Verdict:
        """The verdict on a create (``old`` None) or update of ``pod`` in ``namespace`` by ``user``."""
        name = group_label(pod, self.names)
        if not name or (old is not None and group_label(old, self.names) == name):
            return ALLOWED
        account = _service_account(pod)
        book = self.ledger.tenancy
        with self.ledger.lock:
            if "groups" not in book.synced:
                return Verdict(False, NOT_SYNCED.format(group=name))
            if name in book.broken_groups:
                return Verdict(False, f"ResourceGroup {name} cannot be read: {book.broken_groups[name]}")
            group = book.groups.get(name)
        if group is None:
            return Verdict(False, f"resource group {name} does not exist (label {self.names.group_label}); "
                                  "create the group before the pods that name it, whose creators it is checked against")
        if group.admits(namespace, account) or group.admits_creator(user, groups):
            return ALLOWED
        return Verdict(False, f"resource group {name} admits neither namespace {namespace} (ServiceAccount "
                              f"{account}) nor the requester {user}: its subjects are {subjects_text(group)} "
                              "(User and Group subjects match the identity that creates the pod or sets its "
                              "group label: for pods a controller creates, that is the controller)")


def subjects_text(group: ResourceGroup) -> str:
    """The group's subjects in a refusal (the first :data:`MAX_SHOWN`, then a count)."""
    shown = [f"{s.kind} {s.namespace}/{s.name}" if s.namespace else f"{s.kind} {s.name}"
             for s in group.subjects[:MAX_SHOWN]]
    more = len(group.subjects) - MAX_SHOWN
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")
