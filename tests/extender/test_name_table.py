"""The name table maps node lists to exactly the rows the ledger's index gives, or declines."""

from __future__ import annotations

import random
from itertools import repeat

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.model import GpuCard, NodeSpec
from gpupool.core.state import ClusterState
from gpupool.extender import name_table
from gpupool.extender.name_table import NameTable
from gpupool.extender.node_rows import TABLE_NAMES, NodeRows


def _by_index(ledger: list[str], asked: list[str]) -> list[int]:
    index = {name: row for row, name in enumerate(ledger)}
    return [index.get(name, -1) for name in asked]


def _rows(table: NameTable, asked: list[str]) -> list[int]:
    rows = table.rows(asked)
    assert rows is not None
    return [int(row) for row in rows]


def test_rows_are_the_index_rows_whatever_the_order_repeats_and_strangers() -> None:
    ledger = [f"node-{i:05d}" for i in range(500)] + ["", "n", "node-1", "node-10", "ab", "abc"]
    table = NameTable.of(ledger)
    assert table is not None
    rng = random.Random(7)
    for _ in range(50):
        asked = rng.sample(ledger, rng.randrange(1, len(ledger)))
        asked += [rng.choice(asked) for _ in range(rng.randrange(3))]  # repeats
        asked += rng.sample(["node-00000x", "node-0000", "node-100000", "nope", "a", "bc", "Node-00001",
                             "node-00001 ", " node-00001", "x" * 300], rng.randrange(4))  # strangers
        rng.shuffle(asked)
        assert _rows(table, asked) == _by_index(ledger, asked)


def test_names_that_join_alike_are_not_mistaken() -> None:
    """``ab`` + ``c`` and ``a`` + ``bc`` join to the same letters: each name keeps its own row."""
    ledger = ["ab", "c", "a", "bc"]
    table = NameTable.of(ledger)
    assert table is not None
    assert _rows(table, ["a", "bc", "ab", "c"]) == [2, 3, 0, 1]
    assert _rows(table, ["abc", "b", "", "a"]) == [-1, -1, -1, 2]


def test_a_name_with_the_hash_of_a_ledger_name_is_not_given_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are given only to names spelled as the row's name: with a hash that is only the length
    (every name of one length collides), a stranger of a ledger name's length makes the table
    decline rather than answer that row."""
    monkeypatch.setattr(name_table._Joined, "hashes", lambda self: self.lengths.astype(np.uint64))
    table = NameTable.of(["a", "bb", "ccc"])
    assert table is not None
    assert _rows(table, ["ccc", "a", "bb", "a"]) == [2, 0, 1, 0]
    assert table.rows(["ccc", "xx"]) is None  # "xx" probes to row 1 ("bb") and is refused there
    assert table.rows(["zz"]) is None
    assert NameTable.of(["a", "b"]) is None  # two ledger names with one hash: no table


def test_lists_it_cannot_join_unambiguously_are_declined() -> None:
    table = NameTable.of(["a", "b", "c"])
    assert table is not None
    assert table.rows([]) is None
    assert table.rows(["a", "nœud"]) is None  # not ASCII
    assert table.rows(["a", "b\nc"]) is None  # a newline would split a name in two
    assert NameTable.of(["a", "nœud"]) is None and NameTable.of(["a\n"]) is None and NameTable.of([]) is None
    assert NameTable.of([f"n{i}" for i in range(20)] + ["x" * 500]) is None  # rows of mostly padding


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(min_codepoint=1, max_codepoint=127), max_size=12),
                min_size=1, max_size=40, unique=True),
       st.data())
def test_any_lists_map_as_the_index_does(ledger: list[str], data: st.DataObject) -> None:
    """Any ASCII names (newlines, quotes, empty), any asked list of ledger names and others, with
    repeats: the table's rows are the index's, or it declines (a newline, names too uneven)."""
    strangers = st.text(alphabet=st.characters(min_codepoint=1, max_codepoint=127), max_size=12)
    asked = data.draw(st.lists(st.one_of(st.sampled_from(ledger), strangers), max_size=60))
    table = NameTable.of(ledger)
    if table is None:
        joined = "\n".join(ledger)
        assert joined.count("\n") != len(ledger) - 1 or (max(map(len, ledger)) + 1) * len(ledger) > 4 * (
            len(joined) + 1)
        return
    rows = table.rows(asked)
    if rows is None:
        assert not asked or "\n" in "".join(asked)
        return
    assert rows.tolist() == _by_index(ledger, asked)


def _node(name: str) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=1000, memory_mib=1000, cards=(GpuCard(0, f"GPU-{name}", "A100", 1000),))


def test_node_rows_use_a_table_from_the_second_long_list_of_a_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long lists are mapped by the layout's table from the second one on (the first pays no
    build), a new node means a new table, and a removed node's row reads -1 as before."""
    state = ClusterState()
    names = [f"n{i:04d}" for i in range(TABLE_NAMES + 44)]
    state.add_nodes(_node(name) for name in names)
    node_rows = NodeRows()
    built: list[int] = []
    of = NameTable.of

    def counted(listed: list[str]) -> NameTable | None:
        built.append(len(listed))
        return of(listed)

    rng = random.Random(3)
    asked = [*names, "stranger"]

    def check() -> None:
        rng.shuffle(asked)
        rows, array = node_rows.rows(state, list(asked))
        index = np.fromiter(map(state.index.get, asked, repeat(-1)), dtype=np.int64, count=len(asked))
        expected = np.where(index >= 0, index, 0)
        expected = np.where((index >= 0) & state.present[expected], index, -1)
        assert rows.tolist() == expected.tolist() and array.tolist() == asked

    monkeypatch.setattr(NameTable, "of", counted)
    check()
    assert built == []
    check()
    check()
    assert built == [len(names)]
    state.upsert_node(_node("n-added"))
    asked.append("n-added")
    check()
    check()
    assert built == [len(names), len(names) + 1]
    state.remove_node(names[5])
    check()  # same names per row: the same table, the removed row reads -1
    assert built == [len(names), len(names) + 1]
    short = names[:10]
    assert node_rows.rows(state, short)[0].tolist() == [state.index[n] if n != names[5] else -1 for n in short]
