"""The node agent's heartbeat: one ``coordination.k8s.io/v1`` Lease per node, and how it is named.

The node agent renews it (:mod:`gpupool.nodeagent.heartbeat`); the extender watches every such
Lease and stops placing GPU pods on a node whose Lease lapsed (:mod:`gpupool.extender.liveness`).
Both sides must agree on the name, the label the extender selects by, and which field names the
node, so they live here, in the contract.

Why a Lease and not the Node's own heartbeat: kubelet's node Lease says kubelet lives, not that the
device plugin serving the node's GPUs does; a dead agent leaves kubelet admitting nothing for
gpupool's resources while the extender, reading the node's ``inventory-v1``, keeps placing pods
there. The Lease is the same mechanism kubelet uses, so the admin's tools (``kubectl get leases``)
show it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

#: Every agent Lease is named ``<prefix><node>``: ``gpupool-agent-n1``.
LEASE_PREFIX = "gpupool-agent-"
#: The label the extender's watch selects agent Leases by (its value is :data:`LEASE_COMPONENT`).
LEASE_LABEL = "app.kubernetes.io/component"
LEASE_COMPONENT = "gpupool-node-agent-heartbeat"
#: Where agents renew and the extender watches unless told otherwise: a namespace of their own, as
#: kubelet's node Leases have kube-node-lease, so that the agents' RBAC (update on every Lease there)
#: reaches no other component's Lease (kube-system holds the control plane's leader elections).
DEFAULT_LEASE_NAMESPACE = "gpupool-node-lease"
#: kubelet's own node Lease timings: renewed every 10 s, lapsed after 40 s (four missed renewals).
DEFAULT_RENEW_INTERVAL_S = 10.0
DEFAULT_LEASE_DURATION_S = 40

#: A Lease name is a DNS subdomain (at most 253 characters); longer node names are hashed.
_MAX_NAME = 253
_HASH_CHARS = 16


def lease_name(node: str) -> str:
    """The agent Lease's name for ``node``; the node itself is the Lease's ``holderIdentity``."""
    name = f"{LEASE_PREFIX}{node}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:_HASH_CHARS]
    return f"{name[:_MAX_NAME - _HASH_CHARS - 1]}-{digest}"


def lease_node(lease: dict[str, Any]) -> str:
    """The node a Lease (JSON) beats for: its ``holderIdentity``; "" when absent."""
    holder = (lease.get("spec") or {}).get("holderIdentity")
    return holder if isinstance(holder, str) else ""


def label_selector() -> str:
    """What the extender's list+watch selects."""
    return f"{LEASE_LABEL}={LEASE_COMPONENT}"


def renewed_ago(renew_time: str, now: dt.datetime) -> float:
    """How long before ``now`` a Lease's ``renewTime`` text says it was renewed, in seconds; 0 when
    it lies in the future or cannot be read (a reader may only make a Lease older, never younger)."""
    try:
        stamp = dt.datetime.fromisoformat(renew_time.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return max(0.0, (now - stamp).total_seconds())


def lapsed_reason(node: str, ago_s: float, duration_s: float) -> str:
    """Why GPU pods do not go to ``node`` whose agent last renewed its Lease ``ago_s`` seconds ago,
    past its ``duration_s``: the extender's filter reason, and ``kubectl gpupool why``'s."""
    return (f"node agent on {node} last renewed {ago_s:.0f} s ago (lease {duration_s:g} s): its gpupool "
            "node agent is not running, so no GPU can be granted there")


def missing_reason(node: str, namespace: str) -> str:
    """Why GPU pods do not go to ``node``, which has no agent Lease at all (where one is required)."""
    return (f"node {node} has no gpupool node agent lease ({namespace}/{lease_name(node)}): its agent "
            "has not started, or renews in another namespace than --agent-lease-namespace")
