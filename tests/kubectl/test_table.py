"""The aligned table kubectl users expect."""

from __future__ import annotations

import pytest

from gpupool.kubectl.table import render_table


def test_columns_align_and_the_last_is_not_padded() -> None:
    text = render_table(("A", "LONGER", "C"), [("xyz", "1", "last"), ("q", "22", "")])
    assert text.splitlines() == ["A    LONGER  C", "xyz  1       last", "q    22"]


def test_a_row_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        render_table(("A", "B", "C"), [("1", "2")])
