"""A Node's ``enforcement-v1`` annotation read for the extender and the kubectl plugin.

Both must say the same thing about a node that takes no GPU shares, so the reading and the refusal
text live here, beside the other translations of Kubernetes objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.api.enforcement import EnforcementNotice, EnforcementNoticeError, decode_notice
from gpupool.api.names import ResourceNames


def node_notice(node: Mapping[str, Any], names: ResourceNames) -> EnforcementNotice | None:
    """The node's notice; ``None`` where it has none (an older agent, a node described by hand).

    Raises :class:`~gpupool.api.enforcement.EnforcementNoticeError` for an unreadable one."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(names.enforcement) if isinstance(annotations, Mapping) else None
    if text is None:
        return None
    if not isinstance(text, str):
        raise EnforcementNoticeError("expected a string")
    return decode_notice(text)


def share_refusal(node: Mapping[str, Any], names: ResourceNames) -> str | None:
    """Why no GPU share may be placed on ``node`` (whole cards still may); ``None`` when shares may.

    An unreadable notice refuses shares too: it may hide a node that cannot enforce them, and a
    pod placed there would run unlimited (or be refused by kubelet, which lists no share resource)."""
    try:
        notice = node_notice(node, names)
    except EnforcementNoticeError as exc:
        return unreadable_refusal(names, exc)
    return refusal_of(notice)


def refusal_of(notice: EnforcementNotice | None) -> str | None:
    """Why a node with ``notice`` takes no slice; ``None`` when it takes them."""
    if notice is None or notice.shares:
        return None
    return (f"node takes whole GPUs only: its agent cannot enforce GPU shares ({notice.reason or notice.backend}); "
            "request whole cards, or give the agent an isolation backend")


def unreadable_refusal(names: ResourceNames, error: EnforcementNoticeError) -> str:
    """Why no slice goes to a node whose notice cannot be read."""
    return f"the node's {names.enforcement} annotation is unreadable ({error}); GPU shares are not placed there"
