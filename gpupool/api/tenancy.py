"""The tenancy contract: the ``ResourceGroup`` and ``GpuQuota`` custom resources and the pod,
namespace and node names that select them.

Why typed and strict: a custom resource is written by hand. The CRDs (deploy/crds/) make the
apiserver refuse most mistakes, but a cluster may run without them updated, and a CR the extender
misreads would let a tenant take cards it must not. So every CR is decoded here, field by field,
and a broken one raises :class:`TenancyError` naming the object and the field; the extender then
reports it and treats the object conservatively (see docs/tenancy.md: a broken group admits no
pod, a broken quota refuses every GPU pod of its namespace).

``ResourceGroup`` (cluster-scoped)::

    apiVersion: gpupool.io/v1alpha1
    kind: ResourceGroup
    metadata: {name: team-a}
    spec:
      shared: false                  # false: its GPUs are reserved for its pods
      nodes:
      - name: node-1
        gpus: [GPU-8a1c..., GPU-...]  # UUIDs on that node; omitted: every GPU of the node
      subjects:                      # who may use it; omitted: every namespace
      - {kind: Namespace, name: team-a}
      - {kind: ServiceAccount, namespace: ci, name: trainer}
      - {kind: User, name: alice}    # (and Group): the identity that creates the pod (or sets its
                                     # group label), checked by the extender's pod-group webhook

``GpuQuota`` (namespaced; decoded by :mod:`gpupool.api.quota`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.api.fields import shown
from gpupool.api.limits import text_problem

API_VERSION = "v1alpha1"
MAX_GROUP_NODES = 100_000
"""Nodes one group may list (a cluster of the Kubernetes maximum is 5,000; room for typos only)."""
MAX_NODE_GPUS = 256
"""GPU UUIDs one node entry may list (the core's largest node)."""
MAX_SUBJECTS = 1_000

POD_SUBJECT_KINDS = ("Namespace", "ServiceAccount")
"""Subjects matched against the pod itself (its namespace, its ServiceAccount), at every decision."""
CREATOR_SUBJECT_KINDS = ("User", "Group")
"""Subjects matched against the requester who creates the pod or sets its group label: a pod does
not carry that identity, so only an admission webhook (the ``AdmissionReview``'s ``userInfo``) can
match them (:mod:`gpupool.extender.group_subjects`)."""
SUBJECT_KINDS = POD_SUBJECT_KINDS + CREATOR_SUBJECT_KINDS


class TenancyError(ValueError):
    """A custom resource or a tenancy annotation that cannot be read; the message names it and the field."""


@dataclass(frozen=True)
class TenancyNames:
    """The names of the tenancy contract under the resource domain (default ``gpupool.io``).

    The names are plain attributes, written once from ``domain``: every filter and bind reads the
    pod's label and annotations by them, and formatting them per read was work no answer needed."""

    domain: str = "gpupool.io"
    api_group: str = field(init=False, repr=False, compare=False)
    """The custom resources' API group."""
    group_label: str = field(init=False, repr=False, compare=False)
    """Pod label: the resource group the pod asks for (seed 002: the key names the requester's
    choice, the value the group)."""
    default_groups: str = field(init=False, repr=False, compare=False)
    """Namespace annotation (or label): the group(s) of the namespace's pods that name none;
    several, comma-separated, let the extender choose the best-fitting one."""
    pool_label: str = field(init=False, repr=False, compare=False)
    """Node label: the pool a node belongs to (a ``GpuQuota``'s ``pools`` lists its values)."""
    gpu_uuids: str = field(init=False, repr=False, compare=False)
    """Pod annotation: comma-separated GPU UUIDs the pod may use (pin)."""
    avoid_gpu_uuids: str = field(init=False, repr=False, compare=False)
    """Pod annotation: comma-separated GPU UUIDs the pod must not use."""
    avoid_gpu_models: str = field(init=False, repr=False, compare=False)
    """Pod annotation: comma-separated GPU models the pod must not use."""

    def __post_init__(self) -> None:
        domain = self.domain
        for name, value in (("api_group", domain), ("group_label", f"{domain}/group"),
                            ("default_groups", f"{domain}/default-groups"), ("pool_label", f"{domain}/pool"),
                            ("gpu_uuids", f"{domain}/gpu-uuids"), ("avoid_gpu_uuids", f"{domain}/avoid-gpu-uuids"),
                            ("avoid_gpu_models", f"{domain}/avoid-gpu-models")):
            object.__setattr__(self, name, value)


HAMI_PIN_UUIDS = "nvidia.com/use-gpuuuid"
HAMI_AVOID_UUIDS = "nvidia.com/nouse-gpuuuid"
HAMI_AVOID_MODELS = "nvidia.com/nouse-gputype"
"""HAMi's spellings of the same pod controls, read as aliases. Its two model annotations match as
HAMi matches them: any case, a word contained in the card's model (``A100`` names
``NVIDIA-A100-SXM4-80GB``), where gpupool's ``avoid-gpu-models`` names models exactly."""
HAMI_USE_MODELS = "nvidia.com/use-gputype"
"""HAMi: only cards whose model contains one of these words (comma list)."""


@dataclass(frozen=True)
class Subject:
    """Who may use a group: ``kind`` Namespace (``name``), ServiceAccount (``namespace``/``name``),
    User or Group (``name``)."""

    kind: str
    name: str
    namespace: str = ""


@dataclass(frozen=True)
class GroupNode:
    """One node of a group and the GPUs of it bound to the group (None: all of them)."""

    name: str
    gpus: frozenset[str] | None


@dataclass(frozen=True)
class ResourceGroup:
    """A decoded ``ResourceGroup``."""

    name: str
    nodes: tuple[GroupNode, ...]
    shared: bool = False
    subjects: tuple[Subject, ...] = ()

    def admits(self, namespace: str, service_account: str) -> bool:
        """Whether a pod of ``namespace`` running as ``service_account`` may use the group by its
        Namespace and ServiceAccount subjects (no subjects: every pod; User and Group subjects are
        not properties of a pod, see :meth:`admits_creator`)."""
        if not self.subjects:
            return True
        for subject in self.subjects:
            if subject.kind == "Namespace" and subject.name == namespace:
                return True
            if subject.kind == "ServiceAccount" and subject.namespace == namespace \
                    and subject.name == (service_account or "default"):
                return True
        return False

    @property
    def names_creators(self) -> bool:
        """Whether some subject is a User or a Group (matched at pod admission only)."""
        return any(s.kind in CREATOR_SUBJECT_KINDS for s in self.subjects)

    def admits_creator(self, user: str, groups: tuple[str, ...]) -> bool:
        """Whether the requester ``user`` (member of ``groups``), who creates a pod or sets its group
        label, is a User or Group subject of the group."""
        return any((s.kind == "User" and s.name == user) or (s.kind == "Group" and s.name in groups)
                   for s in self.subjects)


def name_field(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise TenancyError(f"{where}: expected a string, got {type(value).__name__}")
    problem = text_problem(value)
    if problem is not None:
        raise TenancyError(f"{where} {shown(value)}: {problem}")
    return value


def list_field(value: Any, where: str, most: int) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TenancyError(f"{where}: expected a list, got {type(value).__name__}")
    if len(value) > most:
        raise TenancyError(f"{where}: at most {most} entries, got {len(value)}")
    return value


def object_field(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TenancyError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def object_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(namespace, name)`` of a custom object ("" namespace for cluster-scoped ones)."""
    meta = object_field(obj.get("metadata"), "metadata")
    namespace = meta.get("namespace") or ""
    name = name_field(meta.get("name"), "metadata.name")
    return (name_field(namespace, "metadata.namespace") if namespace else "", name)


def decode_group(obj: Mapping[str, Any]) -> ResourceGroup:
    """A ``ResourceGroup`` object (JSON as the API serves it), checked field by field."""
    _, name = object_name(obj)
    where = f"ResourceGroup {name}"
    spec = object_field(obj.get("spec"), f"{where}: spec")
    shared = spec.get("shared", False)
    if not isinstance(shared, bool):
        raise TenancyError(f"{where}: spec.shared: expected true or false, got {shown(shared)}")
    nodes: list[GroupNode] = []
    seen: set[str] = set()
    for i, raw in enumerate(list_field(spec.get("nodes"), f"{where}: spec.nodes", MAX_GROUP_NODES)):
        at = f"{where}: spec.nodes[{i}]"
        entry = object_field(raw, at)
        node = name_field(entry.get("name"), f"{at}.name")
        if node in seen:
            raise TenancyError(f"{at}.name: node {node} is listed twice")
        seen.add(node)
        gpus_raw = entry.get("gpus")
        gpus = None
        if gpus_raw is not None:
            entries = list_field(gpus_raw, f"{at}.gpus", MAX_NODE_GPUS)
            listed = [name_field(u, f"{at}.gpus[{j}]") for j, u in enumerate(entries)]
            if not listed:
                raise TenancyError(f"{at}.gpus: empty; list the node's GPUs of the group, or omit gpus "
                                   "for all of them")
            if len(set(listed)) != len(listed):
                raise TenancyError(f"{at}.gpus: a GPU is listed twice")
            gpus = frozenset(listed)
        nodes.append(GroupNode(node, gpus))
    subjects = tuple(_subject(raw, f"{where}: spec.subjects[{i}]")
                     for i, raw in enumerate(list_field(spec.get("subjects"), f"{where}: spec.subjects", MAX_SUBJECTS)))
    return ResourceGroup(name, tuple(nodes), shared, subjects)


def _subject(raw: Any, where: str) -> Subject:
    entry = object_field(raw, where)
    kind = entry.get("kind")
    if kind not in SUBJECT_KINDS:
        raise TenancyError(f"{where}.kind: one of {', '.join(SUBJECT_KINDS)}, got {shown(kind)}")
    name = name_field(entry.get("name"), f"{where}.name")
    namespace = ""
    if kind == "ServiceAccount":
        namespace = name_field(entry.get("namespace"), f"{where}.namespace")
    return Subject(kind, name, namespace)


def name_list(text: Any, where: str) -> frozenset[str]:
    """A comma-separated annotation value as a set of names (blank entries skipped)."""
    if not isinstance(text, str):
        raise TenancyError(f"{where}: expected a string")
    names = [part.strip() for part in text.split(",") if part.strip()]
    for part in names:
        name_field(part, where)
    return frozenset(names)
