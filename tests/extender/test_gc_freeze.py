"""freeze_long_lived: survivors leave the collector's generations, garbage cycles are freed first."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from gpupool.extender.gc_freeze import freeze_long_lived


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfreeze() -> Iterator[None]:
    yield
    gc.unfreeze()


@pytest.mark.slow
def test_survivors_are_frozen_and_garbage_cycles_are_not() -> None:
    kept = [Node() for _ in range(100)]
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle only the cyclic collector can free
    dead = weakref.ref(a)
    del a, b
    frozen = freeze_long_lived()
    assert dead() is None  # collected before freezing, not kept forever
    assert frozen >= len(kept)
    assert gc.get_freeze_count() == frozen
    assert not any(gc.is_tracked(n) and n in gc.get_objects(generation=2) for n in kept[:3])
