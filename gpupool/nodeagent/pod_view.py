"""Build the node agent's :class:`PodView` from a pod as JSON (API object or test fixture).

One converter for every source: the kubernetes client's objects are turned into plain JSON with
``ApiClient().sanitize_for_serialization`` first, and the in-memory test API stores JSON already.
The watch's events are read by :func:`gpupool.nodeagent.node_pod.decode_node_pod`, which builds the
view with :func:`pod_view_from_parts` from the assignment it decoded once for every reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from gpupool.api.annotations import AnnotationError
from gpupool.api.names import ResourceNames
from gpupool.kube.quantity import QuantityError, parse_quantity
from gpupool.nodeagent.allocated_codec import served_resources
from gpupool.nodeagent.assignment_codec import node_assignment
from gpupool.nodeagent.types import (
    ContainerView,
    NodeAssignment,
    PodView,
)

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def _quantity(value: Any) -> int:
    """Extended resources are integers; kubelet counts devices, so a fraction is an error. The
    apiserver returns them canonical (``3000`` comes back as ``3k``), so the quantity grammar reads them."""
    try:
        number = parse_quantity(value)
    except QuantityError:
        number = Decimal(-1)
    if number < 0 or number != number.to_integral_value():
        raise ValueError(f"extended resource quantity {str(value)!r} must be a whole number")
    return int(number)


def _created(meta: Mapping[str, Any]) -> float:
    stamp = meta.get("creationTimestamp")
    if isinstance(stamp, datetime):
        return stamp.timestamp()
    if isinstance(stamp, str) and stamp:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return 0.0


def _claim_names(spec: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, str]:
    """The pod's claim entries (``spec.resourceClaims[].name``) → the ResourceClaim each names: its
    ``resourceClaimName``, or for a template the claim kubelet's pod status records
    (``status.resourceClaimStatuses``; absent until the claim exists). Malformed entries are skipped:
    their containers then hold no claim, as for a pod the agent cannot read."""
    generated = {str(s["name"]): str(s["resourceClaimName"]) for s in status.get("resourceClaimStatuses") or []
                 if isinstance(s, Mapping) and s.get("name") and s.get("resourceClaimName")}
    found = {}
    for entry in spec.get("resourceClaims") or []:
        if not isinstance(entry, Mapping) or not entry.get("name"):
            continue
        name = entry.get("resourceClaimName") or generated.get(str(entry["name"]))
        if name:
            found[str(entry["name"])] = str(name)
    return found


def pod_assignment(annotations: Mapping[str, Any], names: ResourceNames,
                   pod_key: str) -> tuple[NodeAssignment | None, str]:
    """The pod's ``assignment-v1`` decoded; ``(None, why)`` when it does not decode, ``(None, "")``
    when the pod has none."""
    raw = annotations.get(names.assignment)
    if raw is None:
        return None, ""
    try:
        return node_assignment(raw, pod_key), ""
    except AnnotationError as exc:
        return None, str(exc)


def pod_view_from_json(pod: Mapping[str, Any], names: ResourceNames) -> PodView:
    """Reduce a pod to its identity, containers' GPU limits (gpupool's resources and the foreign
    aliases, any of which kubelet may allocate), phase and decoded assignment (a single GET; the
    watch decodes its events with :func:`gpupool.nodeagent.node_pod.decode_node_pod`)."""
    meta = pod.get("metadata") or {}
    pod_key = f"{meta.get('namespace', 'default')}/{meta['name']}"
    return pod_view_from_parts(pod, names, *pod_assignment(meta.get("annotations") or {}, names, pod_key))


def pod_view_from_parts(pod: Mapping[str, Any], names: ResourceNames, assignment: NodeAssignment | None,
                        assignment_error: str) -> PodView:
    """:func:`pod_view_from_json` with the assignment already decoded (:func:`pod_assignment`), so a
    reader that needs it too decodes it once."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    served = frozenset(names.managed())
    claim_names = _claim_names(spec, status)
    containers = []
    for init, key in ((True, "initContainers"), (False, "containers")):
        for c in spec.get(key) or []:
            resources = c.get("resources") or {}
            limits = resources.get("limits") or {}
            ours = {k: _quantity(v) for k, v in limits.items() if k in served}
            restartable = init and c.get("restartPolicy") == "Always"  # a native sidecar
            claims = tuple(dict.fromkeys(claim_names[ref["name"]] for ref in resources.get("claims") or []
                                         if isinstance(ref, Mapping) and ref.get("name") in claim_names))
            containers.append(ContainerView(name=str(c["name"]), init=init, limits=ours, restartable=restartable,
                                            claims=claims))
    namespace, name = str(meta.get("namespace", "default")), str(meta["name"])
    annotations = meta.get("annotations") or {}
    allocated: dict[str, frozenset[str]] = {}
    raw_allocated = annotations.get(names.allocated)
    if raw_allocated:
        try:
            allocated = served_resources(raw_allocated)
        except AnnotationError:
            allocated = {}  # unreadable: containers count as unserved, PodResources still tells
    terminated = status.get("phase") in _TERMINAL_PHASES or meta.get("deletionTimestamp") is not None
    return PodView(namespace=namespace, name=name, uid=str(meta.get("uid", "")),
                   node=str(spec.get("nodeName", "")), created=_created(meta), terminated=terminated,
                   containers=tuple(containers), assignment=assignment, assignment_error=assignment_error,
                   allocated=allocated)
