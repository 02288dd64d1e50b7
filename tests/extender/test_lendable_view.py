"""The extender's view of lending: a node's lent cards (fails closed) and a pod's borrower mark."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.lending import Lendable, LendableCard, LendingNames, encode_lendable
from gpupool.extender.lendable import borrower_annotations, is_borrower, node_lendable

NAMES = LendingNames()
CARD = LendableCard(index=1, uuid="GPU-1", owner="ml/owner", owner_container="main", memory_mib=8192,
                    compute_percent=100, idle_since=100.0)


def node(annotations: dict[str, Any] | None) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "annotations": annotations}}


def test_a_published_card_is_read() -> None:
    text = encode_lendable(Lendable(updated=200.0, cards=(CARD,)))
    assert node_lendable(node({NAMES.lendable: text}), NAMES) == ((CARD,), None)


@pytest.mark.parametrize(("annotations", "problem"), [
    pytest.param(None, None, id="no-annotations"),
    pytest.param({}, None, id="nothing-lent"),
    pytest.param({NAMES.lendable: "{"}, "not JSON", id="torn"),
    pytest.param({NAMES.lendable: '{"v":2,"updated":1,"cards":[]}'}, "version 2", id="other-version"),
    pytest.param({NAMES.lendable: "x" * (64 * 1024 + 1)}, "at most", id="oversized"),
])
def test_an_unreadable_annotation_lends_nothing(annotations: dict[str, Any] | None, problem: str | None) -> None:
    cards, reason = node_lendable(node(annotations), NAMES)
    assert cards == ()
    assert (reason is None) == (problem is None)
    if problem is not None:
        assert reason is not None and problem in reason


def test_borrower_marks_round_trip() -> None:
    marks = borrower_annotations("ml/owner", NAMES)
    assert marks == {"gpupool.io/borrowed": "true", "gpupool.io/borrowed-from": "ml/owner"}
    assert is_borrower({"metadata": {"annotations": marks}}, NAMES)
    assert not is_borrower({"metadata": {"annotations": {}}}, NAMES)
    assert not is_borrower(None, NAMES)
