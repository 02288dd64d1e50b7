"""The tree keeps its shape: small modules with one job (generated gRPC stubs excepted)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400


def hand_written_modules() -> list[Path]:
    """Every Python module of the package and the benchmarks that a person writes and reads."""
    found = [*sorted((ROOT / "gpupool").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]
    return [p for p in found if "generated" not in p.parts]


def test_every_module_stays_small() -> None:
    too_long = {str(p.relative_to(ROOT)): n for p in hand_written_modules()
                if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not too_long, f"split these by job (lines over {MAX_LINES}): {too_long}"
