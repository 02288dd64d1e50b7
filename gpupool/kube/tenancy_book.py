"""The tenancy objects the extender knows: resource groups, GPU quotas and namespaces' default
groups, as the watches deliver them (:mod:`gpupool.extender.tenancy_watch`).

Why its own store: these objects change rarely and independently of nodes and pods, and every
change must reach the next decision without a restart. The store keeps each object decoded (or the
reason it cannot be), bumps :attr:`TenancyBook.version` on every change (the service's memo of the
last filter and the admission's compiled groups key on it), and says what it could not read.

A broken object is reported (logged once per change, and in :meth:`TenancyBook.problems`) and
treated conservatively: a group that cannot be read admits no pod (pods naming it are refused with
the reason); a quota that cannot be read refuses every GPU pod of its namespace
(:func:`gpupool.api.quota.refusing_quota`); a namespace's unreadable default refuses its pods that
name no group.

Not thread-safe on its own: the cache calls it under its lock.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.api.quota import decode_quota, refusing_quota
from gpupool.api.tenancy import ResourceGroup, TenancyError, TenancyNames, decode_group, object_name
from gpupool.core.quota import Quota
from gpupool.kube.tenancy import PodTenancy, namespace_defaults

log = logging.getLogger(__name__)


@dataclass
class TenancyBook:
    """Groups by name, quotas by namespace and object name, namespaces' default groups."""

    names: TenancyNames = field(default_factory=TenancyNames)
    groups: dict[str, ResourceGroup] = field(default_factory=dict)
    broken_groups: dict[str, str] = field(default_factory=dict)
    quotas: dict[str, dict[str, Quota]] = field(default_factory=dict)
    broken_quotas: dict[str, str] = field(default_factory=dict)
    quota_status: dict[str, Any] = field(default_factory=dict)
    """Per ``namespace/name``, the ``status`` each quota had when last seen (the status writer
    compares with it; a status change alone is no tenancy change, so it bumps no version)."""
    defaults: dict[str, tuple[str, ...]] = field(default_factory=dict)
    broken_defaults: dict[str, str] = field(default_factory=dict)
    reserving: set[str] = field(default_factory=set)
    """The readable groups that are not ``shared``: those reserve their cards from pods without a
    group (kept with ``groups``, so :meth:`leaves_alone` need not look at every group)."""
    version: int = 0
    synced: set[str] = field(default_factory=set)
    """Which of "groups", "quotas", "namespaces" have had a full list applied."""

    # ------------------------------------------------------------------------------ groups
    def upsert_group(self, obj: Mapping[str, Any]) -> None:
        try:
            group = decode_group(obj)
        except TenancyError as exc:
            name = _name_or_empty(obj)
            if not name:
                log.warning("ignoring a ResourceGroup without a readable name: %s", exc)
                return
            self.groups.pop(name, None)
            self.reserving.discard(name)
            self.broken_groups[name] = str(exc)
            log.warning("%s; pods naming group %s are refused until it is fixed", exc, name)
        else:
            self.broken_groups.pop(group.name, None)
            if self.groups.get(group.name) == group:
                return
            self.groups[group.name] = group
            if group.shared:
                self.reserving.discard(group.name)
            else:
                self.reserving.add(group.name)
        self.version += 1

    def remove_group(self, obj: Mapping[str, Any]) -> None:
        name = _name_or_empty(obj)
        self.reserving.discard(name)
        if self.groups.pop(name, None) is not None or self.broken_groups.pop(name, None) is not None:
            self.version += 1

    def replace_groups(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.groups.clear()
        self.broken_groups.clear()
        self.reserving.clear()
        for obj in objs:
            self.upsert_group(obj)
        self.synced.add("groups")
        self.version += 1

    # ------------------------------------------------------------------------------ quotas
    def upsert_quota(self, obj: Mapping[str, Any]) -> None:
        try:
            namespace, name = object_name(obj)
        except TenancyError as exc:
            log.warning("ignoring a GpuQuota without a readable name: %s", exc)
            return
        self.quota_status[f"{namespace}/{name}"] = obj.get("status")
        try:
            quota = decode_quota(obj)
            self.broken_quotas.pop(f"{namespace}/{name}", None)
        except TenancyError as exc:
            quota = refusing_quota(namespace, name, str(exc))
            self.broken_quotas[f"{namespace}/{name}"] = str(exc)
            log.warning("%s; namespace %s gets no GPU until it is fixed", exc, namespace)
        held = self.quotas.setdefault(namespace, {})
        if held.get(name) != quota:
            held[name] = quota
            self.version += 1

    def remove_quota(self, obj: Mapping[str, Any]) -> None:
        try:
            namespace, name = object_name(obj)
        except TenancyError:
            return
        held = self.quotas.get(namespace, {})
        self.broken_quotas.pop(f"{namespace}/{name}", None)
        self.quota_status.pop(f"{namespace}/{name}", None)
        if held.pop(name, None) is not None:
            self.version += 1
        if not held:
            self.quotas.pop(namespace, None)

    def replace_quotas(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.quotas.clear()
        self.broken_quotas.clear()
        self.quota_status.clear()
        for obj in objs:
            self.upsert_quota(obj)
        self.synced.add("quotas")
        self.version += 1

    def quotas_of(self, namespace: str) -> tuple[Quota, ...]:
        """Every quota of ``namespace``, in name order."""
        held = self.quotas.get(namespace)
        return tuple(held[name] for name in sorted(held)) if held else ()

    # -------------------------------------------------------------------------- namespaces
    def upsert_namespace(self, obj: Mapping[str, Any]) -> None:
        name, groups, problem = namespace_defaults(obj, self.names)
        if not name:
            return
        before = (self.defaults.get(name), self.broken_defaults.get(name))
        self.defaults.pop(name, None)
        self.broken_defaults.pop(name, None)
        if problem is not None:
            self.broken_defaults[name] = problem
            log.warning("%s", problem)
        elif groups:
            self.defaults[name] = groups
        if before != (self.defaults.get(name), self.broken_defaults.get(name)):
            self.version += 1

    def remove_namespace(self, obj: Mapping[str, Any]) -> None:
        name = _name_or_empty(obj)
        if self.defaults.pop(name, None) is not None or self.broken_defaults.pop(name, None) is not None:
            self.version += 1

    def replace_namespaces(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.defaults.clear()
        self.broken_defaults.clear()
        for obj in objs:
            self.upsert_namespace(obj)
        self.synced.add("namespaces")
        self.version += 1

    # ------------------------------------------------------------------------------- views
    def leaves_alone(self, tenant: PodTenancy) -> bool:
        """True when no tenancy object can narrow or refuse ``tenant``'s pod: it names no group and
        has no card controls, its namespace has no quota, default group or unreadable default,
        and no group reserves cards from pods without one. The admission of such a pod is its
        request as asked (:meth:`Admissions.admit <gpupool.kube.tenancy_layers.Admissions.admit>`
        adds no layer), so the extender asks this one cheap question first and skips the layers."""
        namespace = tenant.namespace
        return (not tenant.group and tenant.controls is None and not self.reserving
                and not self.quotas.get(namespace) and namespace not in self.defaults
                and namespace not in self.broken_defaults)

    @property
    def all_synced(self) -> bool:
        return self.synced >= {"groups", "quotas", "namespaces"}

    def problems(self) -> dict[str, str]:
        """Every object that cannot be read, with the reason (groups, quotas, namespaces)."""
        found = {f"ResourceGroup {name}": reason for name, reason in self.broken_groups.items()}
        found.update({f"GpuQuota {key}": reason for key, reason in self.broken_quotas.items()})
        found.update({f"Namespace {name}": reason for name, reason in self.broken_defaults.items()})
        return found


def _name_or_empty(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else ""
