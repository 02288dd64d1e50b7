"""Every benchmark runs as ``python3 bench/<name>.py`` from a checkout: nothing of ``tests/``.

``tests`` is not a package the checkout installs, and ``python3 bench/x.py`` puts ``bench/`` (not the
repository root) first on ``sys.path``, so ``bench/reclaim.py`` importing the end-to-end helpers
failed without ``PYTHONPATH=.``. What benchmarks and tests share lives in :mod:`gpupool.testing` or
in ``bench/``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = sorted((ROOT / "bench").glob("*.py"))


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_no_benchmark_imports_the_tests() -> None:
    offending = {p.name: sorted(m for m in imported_modules(p) if m == "tests" or m.startswith("tests."))
                 for p in BENCH}
    assert {name: mods for name, mods in offending.items() if mods} == {}


def test_the_scan_sees_nested_imports(tmp_path: Path) -> None:
    script = tmp_path / "x.py"
    script.write_text("def run():\n    from tests.e2e.e2e_support import ExtenderProcess\n    import tests.kube\n")
    assert imported_modules(script) == {"tests.e2e.e2e_support", "tests.kube"}


@pytest.mark.slow  # one interpreter per benchmark (scripts/test-all runs it)
def test_every_benchmark_answers_help_from_the_repository_root() -> None:
    """``python3 bench/<name>.py --help`` with no ``PYTHONPATH``, all at once (each imports numpy and
    friends; ~1 s apiece)."""
    scripts = [p for p in BENCH if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8")]
    assert any(p.name == "reclaim.py" for p in scripts)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs = {p.name: subprocess.Popen([sys.executable, str(p.relative_to(ROOT)), "--help"], cwd=ROOT, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for p in scripts}
    failed = {}
    for name, run in runs.items():
        _, err = run.communicate(timeout=120)
        if run.returncode:
            failed[name] = err.strip().splitlines()[-1:]
    assert failed == {}
