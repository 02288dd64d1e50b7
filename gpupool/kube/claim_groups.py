"""Resource groups for DRA claims: which of gpupool's cards a new ResourceClaim may be allocated,
written into the claim as a CEL selector on each request of gpupool's device classes (issue 24,
docs/dra.md "Resource groups and claims").

Why a selector: kube-scheduler's DRA allocator, not gpupool, chooses a claim's card; the only way to
keep it inside a group is to make the claim itself ask for the group's cards. The extender's
mutating webhook (``/admission/claim-groups``) adds, at the claim's creation, one selector per
request of gpupool's classes (``exactly`` and each ``firstAvailable`` alternative):

* a claim whose namespace has default groups (annotation ``gpupool.io/default-groups``), or whose
  own label ``gpupool.io/group`` names a group: ``device.attributes["<driver>"].uuid in [...]``,
  the UUIDs of every card of the groups that admit the claim's namespace (a node listed without
  GPUs brings the cards the extender knows on it at that moment);
* any other claim: ``!(device.attributes["<driver>"].uuid in [...])`` over the cards that unshared
  groups reserve, split into as many selectors as Kubernetes' 10 KiB per expression needs.

A group admits a claim when it has no subjects or a ``Namespace`` subject names the claim's
namespace: a claim has no ServiceAccount, and the requester of a claim made from a template is the
resourceclaim controller, so ``ServiceAccount``, ``User`` and ``Group`` subjects admit no claim.
What cannot be written is refused with the reason, never let through unrestricted: a group that
cannot be read or does not exist, a namespace whose default cannot be read, no group admitting the
namespace, an allowed set larger than one expression holds (about 230 UUIDs), more than Kubernetes'
32 selectors on a request.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.api.dra import ATTR_UUID
from gpupool.api.tenancy import ResourceGroup
from gpupool.kube.device_selector import MAX_EXPRESSION_CHARS
from gpupool.kube.tenancy_book import TenancyBook

MAX_SELECTORS = 32
"""Kubernetes' limit on the selectors of one request (``DeviceSelectorsMaxSize``)."""


class ClaimGroupError(ValueError):
    """The claim cannot be restricted to what its groups allow; the message says why (the webhook
    refuses the claim with it)."""


@dataclass(frozen=True)
class ClaimCards:
    """The cards a claim may be given: only ``allowed`` (when not None), never ``avoided``;
    ``why`` names the groups, for the webhook's log and warning."""

    allowed: frozenset[str] | None
    avoided: frozenset[str]
    why: str


def _admits_claims(group: ResourceGroup, namespace: str) -> bool:
    return not group.subjects or any(s.kind == "Namespace" and s.name == namespace for s in group.subjects)


def _group_cards(group: ResourceGroup, node_cards: Mapping[str, Sequence[str]]) -> set[str]:
    cards: set[str] = set()
    for node in group.nodes:
        cards.update(node.gpus if node.gpus is not None else node_cards.get(node.name, ()))
    return cards


def claim_cards(book: TenancyBook, namespace: str, labels: Mapping[str, Any],
                node_cards: Mapping[str, Sequence[str]]) -> ClaimCards:
    """The cards a claim of ``namespace`` carrying ``labels`` may be given (``node_cards``: each
    node's card UUIDs the extender knows now); :class:`ClaimGroupError` when it may be given none."""
    named = labels.get(book.names.group_label)
    if isinstance(named, str) and named.strip():
        names: tuple[str, ...] = (named.strip(),)
    elif namespace in book.broken_defaults:
        raise ClaimGroupError(f"namespace {namespace}: {book.broken_defaults[namespace]}")
    else:
        names = book.defaults.get(namespace, ())
    if not names:
        reserved: set[str] = set()
        for name in sorted(book.reserving):
            reserved |= _group_cards(book.groups[name], node_cards)
        return ClaimCards(None, frozenset(reserved), "cards no resource group reserves")
    allowed: set[str] = set()
    admitting: list[str] = []
    refused: list[str] = []
    for name in names:
        if name in book.broken_groups:
            raise ClaimGroupError(f"resource group {name} cannot be read: {book.broken_groups[name]}")
        group = book.groups.get(name)
        if group is None:
            raise ClaimGroupError(f"resource group {name} does not exist")
        if not _admits_claims(group, namespace):
            refused.append(name)
            continue
        admitting.append(name)
        allowed |= _group_cards(group, node_cards)
    if not admitting:
        raise ClaimGroupError(f"no resource group of {', '.join(refused)} admits claims of namespace {namespace} "
                              "(a claim is admitted by a Namespace subject, or by a group without subjects)")
    return ClaimCards(frozenset(allowed), frozenset(), "resource group " + ", ".join(admitting))


def _uuid_ref(driver: str) -> str:
    return f"device.attributes[{json.dumps(driver)}].{ATTR_UUID}"


def _list(uuids: Iterable[str]) -> str:
    return "[" + ", ".join(json.dumps(u) for u in sorted(uuids)) + "]"


def selector_expressions(cards: ClaimCards, driver: str) -> tuple[str, ...]:
    """The CEL expressions (ANDed, as a request's selectors are) that keep a device of ``driver``
    within ``cards``; empty when nothing is to be kept out."""
    ref = _uuid_ref(driver)
    if cards.allowed is not None:
        expression = f"{ref} in {_list(cards.allowed)}"
        if len(expression) > MAX_EXPRESSION_CHARS:
            raise ClaimGroupError(f"{cards.why}: its {len(cards.allowed)} cards do not fit one CEL selector "
                                  f"({len(expression)} characters, Kubernetes allows {MAX_EXPRESSION_CHARS})")
        return (expression,)
    expressions: list[str] = []
    chunk: list[str] = []
    for uuid in sorted(cards.avoided):
        if chunk and len(f"!({ref} in {_list([*chunk, uuid])})") > MAX_EXPRESSION_CHARS:
            expressions.append(f"!({ref} in {_list(chunk)})")
            chunk = []
        chunk.append(uuid)
    if chunk:
        expressions.append(f"!({ref} in {_list(chunk)})")
    return tuple(expressions)


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _selector_ops(path: str, entry: Mapping[str, Any], expressions: Sequence[str]) -> list[dict[str, Any]]:
    present = entry.get("selectors")
    have = present if isinstance(present, list) else []
    if len(have) + len(expressions) > MAX_SELECTORS:
        raise ClaimGroupError(f"{path}: {len(have)} selectors and the {len(expressions)} the resource groups add "
                              f"exceed Kubernetes' {MAX_SELECTORS}")
    added = [{"cel": {"expression": e}} for e in expressions]
    if not isinstance(present, list):
        return [{"op": "add", "path": f"{path}/selectors", "value": added}]
    return [{"op": "add", "path": f"{path}/selectors/-", "value": a} for a in added]


def claim_patch(claim: Mapping[str, Any], classes: frozenset[str],
                expressions: Sequence[str]) -> tuple[dict[str, Any], ...]:
    """JSON patch adding ``expressions`` to every request of ``claim`` (``spec.devices.requests``,
    ``exactly`` and each ``firstAvailable`` alternative) that names one of ``classes``."""
    if not expressions:
        return ()
    requests = _map(_map(claim.get("spec")).get("devices")).get("requests")
    ops: list[dict[str, Any]] = []
    for i, request in enumerate(requests if isinstance(requests, list) else ()):
        request = _map(request)
        exactly = _map(request.get("exactly"))
        if exactly.get("deviceClassName") in classes:
            ops += _selector_ops(f"/spec/devices/requests/{i}/exactly", exactly, expressions)
        among = request.get("firstAvailable")
        for j, alternative in enumerate(among if isinstance(among, list) else ()):
            if _map(alternative).get("deviceClassName") in classes:
                ops += _selector_ops(f"/spec/devices/requests/{i}/firstAvailable/{j}", _map(alternative), expressions)
    return tuple(ops)
