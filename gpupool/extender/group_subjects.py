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
first), and so does a cache that has not listed the groups yet when the API cannot be read either
(the client retries).

A pod admitted here keeps its group when the subjects are narrowed later, as a pod keeps running
when RBAC is narrowed; its Namespace and ServiceAccount are still matched at every filter unless the
group has User or Group subjects.

Reads the extender's cache, under its lock, and trusts it to admit: no API call for a pod the
cache admits. A refusal is confirmed by one bounded read of the group from the API first (given a
reader), because the cache follows a watch that may lag: ``kubectl apply`` of a new group and a pod
naming it, or a group's subjects widened a moment before, would otherwise refuse a pod the group
admits. A stale cache can so only delay a refusal, never admit a pod the group refuses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpupool.api.tenancy import ResourceGroup, TenancyError, TenancyNames, decode_group
from gpupool.extender.admission import ALLOWED, Verdict
from gpupool.extender.ledger_reads import TenancyLedger

log = logging.getLogger(__name__)

ReadGroup = Callable[[str, float], Mapping[str, Any] | None]
"""One ResourceGroup read from the API by name within a timeout (s): None when it does not exist;
raises when it cannot be read."""
READ_TIMEOUT_S = 1.0
"""The confirming read's bound: the webhook's ``timeoutSeconds`` is 3 s."""
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

    def __init__(self, ledger: TenancyLedger, names: TenancyNames, read_group: ReadGroup | None = None) -> None:
        self.ledger = ledger
        self.names = names
        self.read_group = read_group
        """Confirms the cache's refusals; with it :meth:`review` may block (run it off the event loop)."""

    @property
    def blocking(self) -> bool:
        """Whether :meth:`review` may wait on the API."""
        return self.read_group is not None

    def review(self, pod: Mapping[str, Any], old: Mapping[str, Any] | None, namespace: str, user: str,
               groups: tuple[str, ...]) -> Verdict:
        """The verdict on a create (``old`` None) or update of ``pod`` in ``namespace`` by ``user``."""
        name = group_label(pod, self.names)
        if not name or (old is not None and group_label(old, self.names) == name):
            return ALLOWED
        account = _service_account(pod)
        verdict = self._judge(name, self._cached(name), namespace, account, user, groups)
        if verdict.allowed or self.read_group is None:
            return verdict
        live = self._read(name)
        return verdict if live is None else self._judge(name, live, namespace, account, user, groups)

    def _cached(self, name: str) -> ResourceGroup | str:
        """The group as the cache has it, or why it cannot be judged from the cache."""
        book = self.ledger.tenancy
        with self.ledger.lock:
            if "groups" not in book.synced:
                return NOT_SYNCED.format(group=name)
            if name in book.broken_groups:
                return f"ResourceGroup {name} cannot be read: {book.broken_groups[name]}"
            group = book.groups.get(name)
        return self._absent(name) if group is None else group

    def _read(self, name: str) -> ResourceGroup | str | None:
        """The group as the API has it now, or why not; None when the API could not answer (the
        cache's refusal stands)."""
        assert self.read_group is not None
        try:
            obj = self.read_group(name, READ_TIMEOUT_S)
        except Exception as exc:  # a timeout, a refusal, a broken connection: keep the cache's verdict
            log.info("pod-groups: resource group %s cannot be read from the API: %s", name, exc)
            return None
        if obj is None:
            return self._absent(name)
        try:
            return decode_group(obj)
        except TenancyError as exc:
            return f"ResourceGroup {name} cannot be read: {exc}"

    def _absent(self, name: str) -> str:
        return (f"resource group {name} does not exist (label {self.names.group_label}); "
                "create the group before the pods that name it, whose creators it is checked against")

    @staticmethod
    def _judge(name: str, group: ResourceGroup | str, namespace: str, account: str, user: str,
               groups: tuple[str, ...]) -> Verdict:
        if isinstance(group, str):
            return Verdict(False, group)
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
