"""Concurrent binds of borrowers and owners never put more on a card than the ledger allows."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gpupool.api.annotations import decode_assignment
from gpupool.api.lending import is_borrowed
from gpupool.extender.binder import Binder
from gpupool.extender.service import BindResult
from tests.extender.binder_world import ASSIGNMENT, WRITES
from tests.extender.lending_world import CARD, LENT_MIB, NAMES, lending_node, lending_world, waiting

BORROWERS = 10
BORROWER_MIB = 3000  # four fit the loan; at most five fit the free card, so the loan fills up
OWNERS = 6
OWNER_MIB = 4000


@pytest.mark.parametrize("one_write", WRITES)
def test_threaded_binds_keep_borrowers_within_the_loan_and_owners_within_the_card(one_write: bool) -> None:
    pods = [waiting(f"b{i}", BORROWER_MIB, age_s=i) for i in range(BORROWERS)]
    pods += [waiting(f"o{i}", OWNER_MIB, age_s=100 + i, priority=5000) for i in range(OWNERS)]
    api, cache, service = lending_world(*pods, nodes=[lending_node(cards=2)])
    service.binder = Binder(cache, api, annotate_in_binding=one_write)
    results: dict[str, BindResult] = {}
    start = threading.Barrier(len(pods))

    def bind(raw: dict[str, Any]) -> None:
        start.wait()
        name = raw["metadata"]["name"]
        results[name] = service.bind("default", name, raw["metadata"]["uid"], "n1")

    threads = [threading.Thread(target=bind, args=(raw,)) for raw in pods]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    lent: dict[int, int] = {}
    owned: dict[int, int] = {}
    for raw in api.list_pods():
        annotations = raw["metadata"]["annotations"]
        if ASSIGNMENT not in annotations or raw["metadata"]["name"] == "owner":
            continue
        for card in decode_assignment(annotations[ASSIGNMENT]).containers[0].cards:
            book = lent if is_borrowed(annotations) else owned
            book[card.index] = book.get(card.index, 0) + card.memory_mib
    assert lent == {0: LENT_MIB}  # borrowers on the lent card up to the loan, never beyond
    assert set(owned) == {1} and owned[1] <= CARD  # nobody else on lent capacity; the free card not over
    on_owned = [raw for raw in api.list_pods() if raw["spec"].get("nodeName")
                and not is_borrowed(raw["metadata"]["annotations"]) and raw["metadata"]["name"] != "owner"]
    assert sum(r.ok for r in results.values()) == LENT_MIB // BORROWER_MIB + len(on_owned)
    assert cache.state.lent.borrowed(0, 0)[0] == LENT_MIB
    assert cache.overcommitted_cards() == 0
    failed = [r.error for n, r in results.items() if n.startswith("b") and not r.ok]
    assert all("lent capacity" in e or "held for the earlier request" in e for e in failed), failed


def test_a_stale_borrower_mark_is_overwritten_when_the_pod_is_placed_on_owned_capacity() -> None:
    raw = waiting("p", 4000, priority=5000)
    raw["metadata"]["annotations"][NAMES.borrowed] = "true"
    api, cache, service = lending_world(raw, nodes=[lending_node(cards=2)])
    assert service.bind("default", "p", raw["metadata"]["uid"], "n1").ok
    assert not is_borrowed(api.get_pod("default", "p")["metadata"]["annotations"])
    assert cache.state.placements["default/p"].borrowed_from is None
