"""A remote share: the pod's request for one and the bind's record of where it is booked.

Why two annotations and not ``assignment-v1``: ``assignment-v1`` names the node the pod is bound
to, and the node agent there grants those cards through its device plugin. A remote share lives on
another node's card, which the pod's own node cannot grant; readers that know nothing of remote
shares (an older extender, the node agent's Allocate) must not take it for a local assignment.

``<domain>/remote-gpu`` (pod, written by the user)::

    "true" | "false"

  ``"true"``: the pod's one GPU container asks, with the usual gpupool resources, for a slice of
  one card (or one whole card) that may be booked on a card of another node and used over the
  network. Any other value is refused with the annotation's name (:func:`wants_remote`).

``<domain>/remote-share-v1`` (pod, written by the extender in the Binding)::

    {"v": 1, "server": "gpu-7", "time": "2026-11-28T17:00:00Z", "podUID": "6f1c...",
     "container": "main",
     "card": {"index": 0, "uuid": "GPU-...", "memoryMiB": 8192, "computeMilli": 300,
              "exclusive": false}}

  ``server`` is the GPU node whose card holds the booking; the pod itself is bound to another
  node. A share of several cards (``gpu-shared: n``: the same slice on n cards of one GPU node)
  lists them, in the order the client numbers its devices, under ``"cards"`` instead of
  ``"card"``; a one-card share is still written with ``"card"``, so readers from before several
  cards decode it as they did (and refuse a several-card share: no ``"card"``). Bounds as in
  :mod:`gpupool.api.annotations`. When the pod's own node has a fitting card
  the bind writes a plain ``assignment-v1`` instead (a local share) and no ``remote-share-v1``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.annotations import Assignment, CardRef, ContainerCards
from gpupool.api.fields import (
    SCHEMA_VERSION,
    AnnotationError,
    bounded,
    format_time,
    load_document,
    parse_time,
    shown,
    text,
)
from gpupool.api.fields import field as read_field
from gpupool.api.limits import MAX_CARD_INDEX, MAX_CARD_MEMORY_MIB, MAX_COMPUTE_PER_CARD
from gpupool.api.names import ResourceNames

WHAT = "remote-share-v1"
MAX_REMOTE_CARDS = 16
"""The most cards one remote share may name (the client's devices): the GPU server serves at most
16 (the wire protocol's ``REMOTE_MAX_DEVICES``)."""


def wants_remote(annotations: Mapping[str, Any], names: ResourceNames) -> bool:
    """Whether the pod asks for a remote share (``<domain>/remote-gpu: "true"``); absent is
    ``False``; raises :class:`AnnotationError` naming the annotation for any value but the two."""
    value = annotations.get(names.remote_gpu)
    if value is None or value == "false":
        return False
    if value == "true":
        return True
    raise AnnotationError(f'annotation {names.remote_gpu} must be "true" or "false", got {shown(value)}')


@dataclass(frozen=True)
class RemoteShare:
    """The decoded ``remote-share-v1``: the server node and the card slices booked for ``container``
    (``card`` first, then ``more_cards``: the client's device 0, 1, ...)."""

    server: str
    time: dt.datetime
    container: str
    card: CardRef
    pod_uid: str = ""
    more_cards: tuple[CardRef, ...] = ()
    """The second and later cards of a share of several cards of the server (empty for one card)."""

    @property
    def cards(self) -> tuple[CardRef, ...]:
        """Every booked card, in the order the client numbers its devices."""
        return (self.card, *self.more_cards)

    @staticmethod
    def from_assignment(assignment: Assignment) -> RemoteShare:
        """The share an assignment of the server node names: one container, one or more cards;
        ``ValueError`` for any other shape (the core never decides one for a remote share)."""
        if len(assignment.containers) != 1 or not assignment.containers[0].cards:
            raise ValueError(f"a remote share is one container's cards, not {assignment.containers}")
        container = assignment.containers[0]
        first, *rest = container.cards
        return RemoteShare(server=assignment.node, time=assignment.time, container=container.name,
                           card=first, more_cards=tuple(rest), pod_uid=assignment.pod_uid)

    def as_assignment(self) -> Assignment:
        """The same booking as an ``assignment-v1`` of the server node: what the ledger books
        (:meth:`Assignment.to_placement` checks each card's uuid there)."""
        return Assignment(node=self.server, time=self.time, pod_uid=self.pod_uid,
                          containers=(ContainerCards(name=self.container, cards=self.cards),))


def _card_document(card: CardRef) -> dict[str, Any]:
    return {"index": card.index, "uuid": card.uuid, "memoryMiB": card.memory_mib, "computeMilli": card.compute,
            "exclusive": card.exclusive}


def _decode_card(raw: dict[str, Any], where: str) -> CardRef:
    card = CardRef(index=bounded(raw, "index", where, MAX_CARD_INDEX), uuid=text(raw, "uuid", where),
                   memory_mib=bounded(raw, "memoryMiB", where, MAX_CARD_MEMORY_MIB, "MiB"),
                   compute=bounded(raw, "computeMilli", where, MAX_COMPUTE_PER_CARD),
                   exclusive=read_field(raw, "exclusive", bool, where))
    if not card.exclusive and card.memory_mib == 0 and card.compute == 0:
        raise AnnotationError(f"{where}: a shared slice holds memory, compute or both")
    return card


def encode_remote_share(share: RemoteShare) -> str:
    """The compact JSON of a ``remote-share-v1`` value (checked with the reader's rules first)."""
    cards: dict[str, Any] = ({"cards": [_card_document(c) for c in share.cards]} if share.more_cards
                             else {"card": _card_document(share.card)})
    doc = {
        "v": SCHEMA_VERSION,
        "server": share.server,
        "time": format_time(share.time),
        **({"podUID": share.pod_uid} if share.pod_uid else {}),
        "container": share.container,
        **cards,
    }
    value = json.dumps(doc, separators=(",", ":"))
    decode_remote_share(value)
    return value


def decode_remote_share(value: str) -> RemoteShare:
    """Validate and decode a ``remote-share-v1`` value; :class:`AnnotationError` names the field."""
    doc = load_document(value, WHAT)
    if "card" in doc and "cards" in doc:
        raise AnnotationError(f"{WHAT}: holds both card and cards; one of them")
    if "cards" in doc:
        listed = read_field(doc, "cards", list, WHAT)
        if not 2 <= len(listed) <= MAX_REMOTE_CARDS:
            raise AnnotationError(f"{WHAT}.cards: 2 to {MAX_REMOTE_CARDS} cards (one card is written as card), "
                                  f"got {len(listed)}")
        cards = []
        for i, raw in enumerate(listed):
            if not isinstance(raw, dict):
                raise AnnotationError(f"{WHAT}.cards[{i}] must be an object")
            cards.append(_decode_card(raw, f"{WHAT}.cards[{i}]"))
        if len({c.uuid for c in cards}) != len(cards) or len({c.index for c in cards}) != len(cards):
            raise AnnotationError(f"{WHAT}.cards: each card once")
    else:
        cards = [_decode_card(read_field(doc, "card", dict, WHAT), f"{WHAT}.card")]
    return RemoteShare(server=text(doc, "server", WHAT),
                       time=parse_time(read_field(doc, "time", str, WHAT), f"{WHAT}.time"),
                       container=text(doc, "container", WHAT),
                       pod_uid=text(doc, "podUID", WHAT) if "podUID" in doc else "", card=cards[0],
                       more_cards=tuple(cards[1:]))
