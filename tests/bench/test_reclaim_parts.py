"""The pure parts of bench/reclaim.py: the pods it creates for each placement and the assignment it
writes by hand (the whole loop runs in tests/e2e/test_lending_loop_e2e.py)."""

from __future__ import annotations

import pytest

from bench.reclaim import BORROWER_MIB, CORE_PERCENT, MEM_UNIT_MIB, OWNER_MIB, assignment, pod
from gpupool.api.annotations import decode_assignment
from gpupool.api.names import ResourceNames

NAMES = ResourceNames()


@pytest.mark.parametrize(("scheduler", "where"), [
    pytest.param("gpupool-x", {"schedulerName": "gpupool-x", "nodeSelector": {"kubernetes.io/hostname": "n1"}},
                 id="extender-placement-asks-the-scheduler"),
    pytest.param(None, {"nodeName": "n1"}, id="hand-placement-binds-to-the-node"),
])
def test_a_borrower_asks_more_than_the_owner_leaves_free(scheduler: str | None, where: dict[str, object]) -> None:
    manifest = pod("b", "n1", "busybox", "true", {}, "/dev/x", BORROWER_MIB, scheduler)
    spec = manifest["spec"]
    assert {k: spec[k] for k in where} == where
    assert not {"schedulerName", "nodeName", "nodeSelector"} - set(where) & set(spec)
    limits = spec["containers"][0]["resources"]["limits"]
    assert limits == {NAMES.gpu_mem: str(BORROWER_MIB // MEM_UNIT_MIB), NAMES.gpu_core: str(CORE_PERCENT)}
    assert BORROWER_MIB > 16 * 1024 - OWNER_MIB  # it fits no free capacity: only the loan


def test_the_hand_written_assignment_books_the_asked_slice_of_card_0() -> None:
    decoded = decode_assignment(assignment("n1", OWNER_MIB))
    [card] = decoded.containers[0].cards
    assert (decoded.node, card.index, card.memory_mib, card.compute) == ("n1", 0, OWNER_MIB, CORE_PERCENT * 10)
