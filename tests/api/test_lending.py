"""The lending contract's codec and priority reading."""

from __future__ import annotations

import json

import pytest

from gpupool.api.lending import (
    Lendable,
    LendableCard,
    LendingFormatError,
    LendingNames,
    Priority,
    decode_lendable,
    encode_lendable,
    lend_device_id,
    lent_device_card_id,
    pod_priority,
)

CARD = LendableCard(0, "GPU-0", "ns/owner", "c", 8192, 100, 1700000000.0)
NAMES = LendingNames()


def test_round_trip_and_the_contracts_field_names() -> None:
    value = Lendable(1700000001.0, (CARD,))
    raw = encode_lendable(value)
    assert decode_lendable(raw) == value
    doc = json.loads(raw)
    assert doc["v"] == 1 and set(doc["cards"][0]) == {"index", "uuid", "owner", "ownerContainer", "memoryMiB",
                                                      "computePercent", "idleSince"}
    assert NAMES.lendable == "gpupool.io/lendable" and NAMES.borrowed_from == "gpupool.io/borrowed-from"


def _doc(**card: object) -> str:
    base = json.loads(encode_lendable(Lendable(1.0, (CARD,))))
    base["cards"][0].update(card)
    return json.dumps(base)


@pytest.mark.parametrize(("raw", "message"), [
    pytest.param("{", "not JSON", id="not-json"),
    pytest.param("[]", "expected a JSON object", id="not-object"),
    pytest.param('{"v":2,"updated":1,"cards":[]}', "version 2", id="version"),
    pytest.param('{"v":1,"updated":1}', "lendable.cards: expected a list", id="no-cards"),
    pytest.param(_doc(owner="owner"), "cards[0].owner: expected namespace/name", id="owner-without-namespace"),
    pytest.param(_doc(memoryMiB=-1), "cards[0].memoryMiB", id="negative-memory"),
    pytest.param(_doc(computePercent=101), "above 100", id="compute-above-100"),
    pytest.param(_doc(index=True), "cards[0].index", id="bool-index"),
    pytest.param(_doc(uuid=""), "cards[0].uuid", id="empty-uuid"),
])
def test_bad_values_are_named(raw: str, message: str) -> None:
    with pytest.raises(LendingFormatError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_lendable(raw)


def test_a_card_listed_twice_is_refused() -> None:
    with pytest.raises(LendingFormatError, match="twice"):
        decode_lendable(encode_lendable(Lendable(1.0, (CARD, CARD))))


@pytest.mark.parametrize(("spec", "annotations", "expected"), [
    pytest.param(None, {}, Priority.LOW, id="no-priority-low"),
    pytest.param(1000, {}, Priority.HIGH, id="at-threshold-high"),
    pytest.param(999, {}, Priority.LOW, id="below-threshold-low"),
    pytest.param(0, {"gpupool.io/priority": "High"}, Priority.HIGH, id="annotation-high"),
    pytest.param(5000, {"gpupool.io/priority": "low"}, Priority.LOW, id="annotation-low"),
    pytest.param(5000, {"gpupool.io/priority": "urgent"}, Priority.HIGH, id="typo-ignored"),
    pytest.param(5000, {"gpupool.io/borrowed": "true", "gpupool.io/priority": "high"}, Priority.LOW,
                 id="borrower-always-low"),
])
def test_pod_priority(spec: int | None, annotations: dict[str, str], expected: Priority) -> None:
    assert pod_priority(spec, annotations) is expected


def test_lent_device_ids() -> None:
    assert lend_device_id("g0-m3") == "lend-g0-m3"
    assert lent_device_card_id("lend-g0-m3") == "g0-m3" and lent_device_card_id("g0-m3") is None
