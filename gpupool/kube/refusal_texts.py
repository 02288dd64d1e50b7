"""Texts of filter's refusals that depend on the pod's context rather than on a card: nodes outside
the pod's group or pools, and nodes that do not serve the foreign resource names it asks for."""

from __future__ import annotations

from gpupool.api.names import ALIAS_FAMILIES, HAMI_FAMILY, UNSERVABLE


def with_outside(failed: dict[str, str], outside: list[dict[str, str]], passed: list[str]) -> dict[str, str]:
    """``failed`` with the reasons of the nodes outside the pod's group, pools or card controls when
    no node passed. kube-scheduler shows reasons only for a pod that fits nowhere; when one fits,
    listing the ~5,000 nodes outside a 50-node group (400 KB of JSON per filter) cost more than the
    rest of the call, so they are then left out, as nodes not passed and not explained."""
    if not passed:
        for reasons in outside:
            failed.update(reasons)
    return failed


def alias_problem(wanted: frozenset[str], served: frozenset[str]) -> str | None:
    """Why a node cannot take a pod's foreign aliases, or ``None`` when it serves them all.

    kubelet drops an extended resource its node does not advertise (it admits the pod and never
    calls a device plugin for it), so placing the pod there would start it without its GPU grant.
    """
    missing = sorted(wanted - served)
    if not missing:
        return None
    hints = sorted({UNSERVABLE[m] for m in missing if m in UNSERVABLE})
    if hints:
        return "; ".join(hints)
    families = sorted({f for f, members in ALIAS_FAMILIES.items() for m in missing if m in members})
    others = [f for f in families if f != HAMI_FAMILY]
    flags = [f"--serve-aliases {','.join(others)}"] if others else []
    if HAMI_FAMILY in families:  # HAMi's names are the cluster's setting, not a node's (docs/cluster-config.md)
        flags.append("--hami")
    return f"node does not serve {', '.join(missing)}: start its gpupool node agent with {' and '.join(flags)}"
