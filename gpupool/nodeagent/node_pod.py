"""One pod event of this node, decoded once into the record every reader of the pod watch shares.

Why one decoder: the agent's watch of its node's pods feeds the pod cache (Allocate, the schedule
check, ``/usage``, the metrics), the lending side (priority, borrower mark, booked cards, checkpoint
key) and the container directory (runtime container IDs). Each used to read the raw pod object
itself, so one event had its annotations read and its ``assignment-v1`` decoded two or three times on
the watch thread. :func:`decode_node_pod` reads the object once; the cache keeps the
:class:`~gpupool.nodeagent.types.PodView`, and every feed receives the same :class:`NodePod`.

Reading never raises: a pod whose containers or annotations cannot be decoded keeps an
:class:`UnreadablePod` as its view (the cache raises it to whoever asks for the pod), while the parts
that could be read (identity, container IDs, the assignment when it decodes) still reach the feeds,
as each feed's own reading used to find them. An object too malformed for those parts reaches the
feeds without containers, so they skip it, as they did when their own reading raised.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.lending import Priority, hami_task_priority
from gpupool.api.names import ResourceNames
from gpupool.nodeagent.containers.pod_containers import PodContainers, pod_containers
from gpupool.nodeagent.gpu_resources import gpu_resources_asked
from gpupool.nodeagent.pod_view import pod_assignment, pod_view_from_parts
from gpupool.nodeagent.types import NodeAssignment, PodView

PodKey = tuple[str, str]


@dataclass(frozen=True)
class UnreadablePod:
    """A pod of this node whose spec or annotations cannot be decoded; the cache's ``get`` raises with this."""

    error: str


PodEntry = PodView | UnreadablePod


@dataclass(frozen=True)
class NodePod:
    """One pod of this node as one watch event (or list entry) said, decoded once.

    ``view``: what the agent grants from (or why it cannot be read). ``assignment``: the decoded
    ``assignment-v1`` (None when absent or unreadable; the view holds the same object and says why),
    kept here too so a pod whose containers cannot be read still names its cards to the lending side.
    ``containers``: the runtime IDs (:func:`~gpupool.nodeagent.containers.pod_containers.pod_containers`),
    None for an object without a UID. ``annotations``, ``spec_priority``
    (``spec.priority`` when an integer), ``task_priority`` (HAMi's ``nvidia.com/priority``) and
    ``controller_uid`` (the controlling owner's UID, empty when none) are what the lending side reads
    its rules' inputs from. ``gpu_resources``: the GPU resources its containers ask for, gpupool's
    and other device plugins' (:func:`~gpupool.nodeagent.gpu_resources.gpu_resources_asked`), which
    the container directory reads (:attr:`asks_gpus`).
    """

    key: PodKey
    view: PodEntry
    assignment: NodeAssignment | None
    containers: PodContainers | None
    annotations: Mapping[str, str]
    spec_priority: int | None
    task_priority: Priority | None
    controller_uid: str
    gpu_resources: frozenset[str] = frozenset()

    @property
    def namespace(self) -> str:
        return self.key[0]

    @property
    def name(self) -> str:
        return self.key[1]

    @property
    def asks_gpus(self) -> bool:
        """Whether the pod booked or asked for a GPU: an assignment (own or borrowed), a
        ResourceClaim, a served resource recorded, or any GPU resource in a container's limits or
        requests, gpupool's or another device plugin's (``nvidia.com/gpu`` of NVIDIA's: a pod that
        asked another plugin for a card is that card's tenant). A pod that cannot be read counts as
        asking (in doubt, its processes stay ordinary holders: only a pod known to ask for no GPU at
        all may be infrastructure, docs/monitor.md "Infrastructure pods")."""
        view = self.view
        if self.assignment is not None or self.gpu_resources or not isinstance(view, PodView):
            return True
        return bool(view.assignment_error or view.allocated
                    or any(c.limits or c.claims for c in view.containers))


def _annotations(meta: Mapping[str, Any]) -> dict[str, str]:
    raw = meta.get("annotations") or {}
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}


def _spec_priority(spec: Any) -> int | None:
    value = spec.get("priority") if isinstance(spec, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _controller_uid(meta: Mapping[str, Any]) -> str:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and isinstance(ref.get("uid"), str) and ref["uid"]:
            return str(ref["uid"])
    return ""


def decode_node_pod(obj: Mapping[str, Any], names: ResourceNames) -> NodePod | None:
    """A watched pod as the record its readers share; ``None`` when it has no name to key it by."""
    meta = obj.get("metadata") or {}
    if not meta.get("name"):
        return None
    key = (str(meta.get("namespace", "default")), str(meta["name"]))
    assignment: NodeAssignment | None = None
    view: PodEntry
    try:
        assignment, error = pod_assignment(meta.get("annotations") or {}, names, f"{key[0]}/{key[1]}")
        view = pod_view_from_parts(obj, names, assignment, error)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        view = UnreadablePod(f"pod {key[0]}/{key[1]} cannot be read: {type(exc).__name__}: {exc}")
    spec = obj.get("spec")
    try:
        return NodePod(key=key, view=view, assignment=assignment, containers=pod_containers(obj),
                       annotations=_annotations(meta), spec_priority=_spec_priority(spec),
                       task_priority=hami_task_priority(spec), controller_uid=_controller_uid(meta),
                       gpu_resources=gpu_resources_asked(spec, names))
    except (ValueError, KeyError, TypeError, AttributeError):  # the feeds skip a pod they cannot read
        return NodePod(key=key, view=view, assignment=assignment, containers=None, annotations={},
                       spec_priority=None, task_priority=None, controller_uid="")
