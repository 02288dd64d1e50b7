"""The card rule on its own: verdicts for one card and for arrays of cards, and what a booking does."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.card_rule import (
    CardBook,
    CardSlots,
    CardUse,
    CardVerdict,
    Demand,
    demand_of,
    fit_mask,
    verdict,
    verdicts,
)
from gpupool.core.model import CardMode, GpuRequest

IDLE, SHARED, EXCLUSIVE = int(CardMode.IDLE), int(CardMode.SHARED), int(CardMode.EXCLUSIVE)
OK = CardSlots(exists=True, healthy=True)
FREE = CardUse(mode=IDLE, mem_free=16_384, compute_free=1_000)
SLICE = Demand(memory=4_096, compute=300, exclusive=False)
WHOLE = Demand(memory=16_384, compute=1_000, exclusive=True)


@pytest.mark.parametrize(
    ("slots", "use", "demand", "expected"),
    [
        pytest.param(OK, FREE, SLICE, CardVerdict.FITS, id="slice-on-idle"),
        pytest.param(OK, FREE, WHOLE, CardVerdict.FITS, id="whole-on-idle"),
        pytest.param(OK, CardUse(SHARED, 4_096, 300), SLICE, CardVerdict.FITS, id="slice-exactly-filling"),
        pytest.param(CardSlots(False, False), FREE, SLICE, CardVerdict.NO_CARD, id="no-card-first"),
        pytest.param(CardSlots(True, False), FREE, SLICE, CardVerdict.UNHEALTHY, id="unhealthy"),
        pytest.param(CardSlots(True, True, model_ok=False, kind_ok=False), FREE, SLICE, CardVerdict.WRONG_MODEL,
                     id="model-before-kind"),
        pytest.param(CardSlots(True, True, model_ok=True, kind_ok=False), FREE, SLICE, CardVerdict.WRONG_KIND,
                     id="kind"),
        pytest.param(OK, CardUse(SHARED, 16_000, 900), WHOLE, CardVerdict.NOT_IDLE, id="whole-on-shared"),
        pytest.param(OK, CardUse(EXCLUSIVE, 0, 0), WHOLE, CardVerdict.NOT_IDLE, id="whole-on-whole"),
        pytest.param(OK, CardUse(EXCLUSIVE, 0, 0), SLICE, CardVerdict.EXCLUSIVE_HELD, id="slice-on-whole"),
        pytest.param(OK, CardUse(SHARED, 4_095, 0), SLICE, CardVerdict.NO_MEMORY, id="memory-before-compute"),
        pytest.param(OK, CardUse(SHARED, 4_096, 299), SLICE, CardVerdict.NO_COMPUTE, id="compute"),
    ],
)
def test_verdict_of_one_card_and_of_an_array_agree(slots: CardSlots, use: CardUse, demand: Demand,
                                                  expected: CardVerdict) -> None:
    assert verdict(slots, use, demand) == expected
    def twice(flag: object) -> np.ndarray | None:
        return None if flag is None else np.array([flag, flag], dtype=bool)

    as_arrays = CardSlots(np.array([slots.exists] * 2, dtype=bool), np.array([slots.healthy] * 2, dtype=bool),
                          twice(slots.model_ok), twice(slots.kind_ok))
    in_arrays = CardUse(*(np.array([v, v], dtype=np.int64) for v in use))
    assert verdicts(as_arrays, in_arrays, demand).tolist() == [expected, expected]
    assert fit_mask(as_arrays, in_arrays, demand).tolist() == [expected == CardVerdict.FITS] * 2


def test_proportional_demand_varies_with_the_card() -> None:
    demand = demand_of(GpuRequest.fraction(250), np.array([16_384, 40_960], dtype=np.int64))
    assert demand.memory.tolist() == [4_096, 10_240]  # type: ignore[union-attr]
    use = CardUse(np.array([IDLE, IDLE]), np.array([4_096, 10_239]), np.array([1_000, 1_000]))
    assert fit_mask(CardSlots(np.array([True, True]), np.array([True, True])), use, demand).tolist() == [True, False]


def book_of(cards: int) -> CardBook:
    total = np.full(cards, 16_384, dtype=np.int64)
    compute = np.full(cards, 1_000, dtype=np.int64)
    return CardBook(total, total.copy(), compute, compute.copy(), np.zeros(cards, dtype=np.int64),
                    np.zeros(cards, dtype=np.int64))


def test_booking_a_whole_card_closes_it_and_giving_it_back_restores_it() -> None:
    book = book_of(2)
    book.book(1, 16_384, 1_000, exclusive=True)
    assert (book.mem_free.tolist(), book.compute_free.tolist(), book.mode.tolist(), book.holders.tolist()) == (
        [16_384, 0], [1_000, 0], [IDLE, EXCLUSIVE], [0, 1])
    book.book(1, 16_384, 1_000, exclusive=True, sign=-1)
    assert (book.mem_free.tolist(), book.compute_free.tolist(), book.mode.tolist(), book.holders.tolist()) == (
        [16_384, 16_384], [1_000, 1_000], [IDLE, IDLE], [0, 0])


def test_slices_share_a_card_until_the_last_one_leaves() -> None:
    book = book_of(1)
    book.book(0, 4_096, 300, exclusive=False)
    book.book(0, 2_048, 200, exclusive=False)
    assert (int(book.mem_free[0]), int(book.compute_free[0]), int(book.mode[0]), int(book.holders[0])) == (
        10_240, 500, SHARED, 2)
    book.book(0, 4_096, 300, exclusive=False, sign=-1)
    assert int(book.mode[0]) == SHARED
    book.book(0, 2_048, 200, exclusive=False, sign=-1)
    assert (int(book.mem_free[0]), int(book.compute_free[0]), int(book.mode[0]), int(book.holders[0])) == (
        16_384, 1_000, IDLE, 0)


def test_a_two_dimensional_book_takes_a_row_and_card() -> None:
    book = CardBook(*(np.zeros((2, 3), dtype=np.int64) for _ in range(6)))
    book.book((1, 2), 0, 0, exclusive=True)
    assert book.mode.tolist() == [[IDLE] * 3, [IDLE, IDLE, EXCLUSIVE]]
