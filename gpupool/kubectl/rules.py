"""The extender's rules beyond card fit, from one read of the cluster, for ``kubectl gpupool why``.

The filter refuses a node for more than its cards: the pod's resource group, its namespace's
GpuQuotas and their pools, the GPUs its annotations pin or avoid, a node agent whose Lease lapsed,
and it places borrowers on lent cards. The plugin applies the same code, never a copy of it:

* tenancy: the ResourceGroups, GpuQuotas and the pod's Namespace go into the extender's own store
  (:class:`gpupool.kube.tenancy_book.TenancyBook`) and the pod is admitted by the extender's own
  layers (:class:`gpupool.kube.tenancy_layers.Admissions`), whose sentences name the group, the
  quota, the pool or the annotation;
* agent Leases: lapse as the extender judges a Lease it sees for the first time (renewed longer
  ago than its duration, by this machine's clock), worded by the contract's sentence
  (:func:`gpupool.api.agent_lease.lapsed_reason`); a node without a Lease is refused only when
  told the extender requires one;
* loans: the nodes that publish lent cards, and whether the pod may borrow, by the contract's rule
  (:func:`gpupool.api.lending.borrow_refusal`).

What cannot be read (a CRD not installed: nothing to apply; a permission missing) becomes a note in
the answer, and the rest is still explained.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.api.agent_lease import lapsed_reason, lease_node, missing_reason, renewed_ago
from gpupool.api.lending import (
    DEFAULT_HIGH_PRIORITY_THRESHOLD,
    LendingFormatError,
    LendingNames,
    borrow_refusal,
    decode_lendable,
)
from gpupool.kube.tenancy_book import TenancyBook


@dataclass(frozen=True)
class ClusterRules:
    """What the filter applies besides card fit, as read for one pod.

    ``book``: the tenancy objects (None when they could not be read); ``node_refusals``: nodes the
    filter refuses whatever the pod (agent Leases); ``loans``: per node lending cards, what that
    means for this pod (appended to the node's reason when its owned capacity does not fit);
    ``notes``: what could not be read or judged."""

    book: TenancyBook | None = None
    node_refusals: Mapping[str, str] = field(default_factory=dict)
    loans: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def tenancy_book(book: TenancyBook, groups: Iterable[Mapping[str, Any]], quotas: Iterable[Mapping[str, Any]],
                 namespaces: Iterable[Mapping[str, Any]]) -> TenancyBook:
    """``book`` filled as the extender's watches fill it (broken objects kept with their reason)."""
    book.replace_groups(groups)
    book.replace_quotas(quotas)
    book.replace_namespaces(namespaces)
    return book


def lease_refusals(nodes: Iterable[str], leases: Iterable[Mapping[str, Any]], namespace: str, *,
                   require: bool, now: dt.datetime) -> dict[str, str]:
    """Per node of ``nodes``, why the filter refuses it for its agent's Lease: renewed longer ago
    than its duration, or (``require``) none at all."""
    beats: dict[str, tuple[float, float]] = {}
    for lease in leases:
        node = lease_node(dict(lease))
        spec = lease.get("spec") or {}
        renew, duration = spec.get("renewTime"), spec.get("leaseDurationSeconds")
        if node and isinstance(renew, str) and isinstance(duration, int) and not isinstance(duration, bool) \
                and duration >= 1:
            beats[node] = (renewed_ago(renew, now), float(duration))
    refused: dict[str, str] = {}
    for node in nodes:
        beat = beats.get(node)
        if beat is None:
            if require:
                refused[node] = missing_reason(node, namespace)
        elif beat[0] >= beat[1]:
            refused[node] = lapsed_reason(node, beat[0], beat[1])
    return refused


def loan_notes(nodes: Iterable[Mapping[str, Any]], pod: Mapping[str, Any], priority: int | None,
               names: LendingNames, *, threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD) -> dict[str, str]:
    """Per node that publishes lent cards, what they mean for ``pod`` (whose ``spec.priority`` is
    ``priority``; high from the cluster's ``threshold``): the filter tries them only for a pod that fits
    no owned capacity and may borrow."""
    refusal = borrow_refusal(pod.get("metadata") or {}, priority, threshold=threshold, names=names,
                             spec=pod.get("spec"))
    notes: dict[str, str] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(names.lendable)
        if not isinstance(text, str):
            continue
        try:
            cards = decode_lendable(text).cards
        except LendingFormatError:
            continue  # the extender reads no loan from a broken annotation either
        if not cards:
            continue
        lent = f"{len(cards)} card(s) lent here by their owners"
        notes[str(meta.get("name") or "")] = (f"; {lent}, which this pod may borrow if its request fits one"
                                              if refusal is None else f"; {lent}, not for this pod: {refusal}")
    return notes
