"""Plain aligned columns, as kubectl prints its own tables (upper-case headers, two spaces apart)."""

from __future__ import annotations

from collections.abc import Sequence

COLUMN_GAP = "  "


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``headers`` and ``rows`` as left-aligned columns; the last column is not padded."""
    widths = [len(h) for h in headers]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"a row has {len(row)} cells for {len(headers)} columns")
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = []
    for row in (headers, *rows):
        cells = [cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=False)]
        lines.append(COLUMN_GAP.join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)
