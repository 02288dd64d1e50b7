"""``assignment-v1``'s ``devices``: one card presented as n devices to a container (virtual cards)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from gpupool.api.annotations import AnnotationError, Assignment, decode_assignment, encode_assignment
from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, NodeSpec, Placement
from gpupool.nodeagent.assignment_codec import node_assignment

STAMP = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
SPEC = NodeSpec("n", 0, 0, cards=(GpuCard(3, "GPU-3", "T4", 16_384), GpuCard(7, "GPU-7", "T4", 16_384)))


def placement(*slices: CardSlice) -> Placement:
    return Placement("ns/p", "n", 0, 0, (ContainerAssignment("main", slices),))


def test_a_virtual_card_round_trips_through_the_extender_and_the_node() -> None:
    placed = placement(CardSlice(1, 8_192, 400, devices=2))
    text = encode_assignment(Assignment.from_placement(placed, SPEC, STAMP))
    assert json.loads(text)["containers"][0]["cards"][0]["devices"] == 2
    assert decode_assignment(text).to_placement("ns/p", SPEC, 0, 0) == placed
    (node_slice,) = node_assignment(text, "ns/p").placement.containers[0].slices
    assert node_slice == CardSlice(7, 8_192, 400, devices=2)  # the node names the card by its index


def test_a_plain_card_writes_no_devices_field() -> None:
    text = encode_assignment(Assignment.from_placement(placement(CardSlice(0, 1_024, 0)), SPEC, STAMP))
    assert "devices" not in text
    assert decode_assignment(text).containers[0].cards[0].devices == 1


@pytest.mark.parametrize(("value", "words"), [
    pytest.param(0, "at least 1 device", id="zero"),
    pytest.param(17, "at most 16", id="too-many"),
    pytest.param("2", "devices", id="text"),
])
def test_a_bad_devices_value_is_refused_by_name(value: object, words: str) -> None:
    doc = json.loads(encode_assignment(Assignment.from_placement(placement(CardSlice(0, 1_024, 0)), SPEC, STAMP)))
    doc["containers"][0]["cards"][0]["devices"] = value
    with pytest.raises(AnnotationError, match=words) as caught:
        decode_assignment(json.dumps(doc))
    assert "cards[0].devices" in str(caught.value)
