"""tests/module_queue.py: pytest runs sharing a queue run each module exactly once, and a run that skips
modules still sets its fixtures up and tears them down as a run of only its own modules would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # each case starts pytest in a process of its own

CONFTEST = '''
import pytest

def note(what):
    with open("events.log", "a") as log:
        log.write(what + "\\n")

@pytest.fixture(scope="session")
def plane():
    note("plane up")
    yield
    note("plane down")

@pytest.fixture(scope="module")
def extender(request):
    note("extender up " + request.module.__name__)
    yield
    note("extender down " + request.module.__name__)
'''

MODULE = '''
def test_one(plane, extender):
    pass

def test_two(plane, extender):
    pass
'''

MODULES = ("test_a", "test_b", "test_c", "test_d")


def suite(root: Path) -> Path:
    """Four modules of two tests each, whose fixtures note their set-up and teardown in events.log."""
    root.mkdir()
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "conftest.py").write_text(CONFTEST)
    for module in MODULES:
        (root / f"{module}.py").write_text(MODULE)
    return root


def run(root: Path, queue: Path) -> subprocess.Popen[str]:
    """Start pytest in ``root`` with the plugin sharing ``queue`` (``=`` form: a separate value would
    be taken for a test path when pytest chooses its root directory)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "tests.module_queue",
         f"--module-queue={queue}"],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def passed(output: str) -> set[str]:
    return {line.split()[1] for line in output.splitlines() if line.startswith("PASSED ")}


def finish(process: subprocess.Popen[str]) -> str:
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    return output


def test_two_runs_sharing_a_queue_run_every_test_once(tmp_path: Path) -> None:
    root = suite(tmp_path / "suite")
    queue = tmp_path / "queue"
    queue.mkdir()
    first, second = run(root, queue), run(root, queue)
    ran = [passed(finish(first)), passed(finish(second))]
    assert ran[0].isdisjoint(ran[1])
    assert ran[0] | ran[1] == {f"{m}.py::{t}" for m in MODULES for t in ("test_one", "test_two")}
    assert len(list(queue.iterdir())) == len(MODULES)


def test_a_run_skips_the_modules_another_claimed_and_keeps_its_fixtures_in_order(tmp_path: Path) -> None:
    root = suite(tmp_path / "suite")
    queue = tmp_path / "queue"
    queue.mkdir()
    (queue / "test_b.py").touch()  # claimed by another run
    (queue / "test_d.py").touch()
    output = finish(run(root, queue))
    assert passed(output) == {f"{m}.py::{t}" for m in ("test_a", "test_c") for t in ("test_one", "test_two")}
    assert "this run took 2 of 4 modules" in output
    assert (root / "events.log").read_text().splitlines() == [
        "plane up",  # once for the run: the skipped module between did not tear it down
        "extender up test_a", "extender down test_a",
        "extender up test_c", "extender down test_c",
        "plane down",
    ]


def test_without_the_option_the_plugin_leaves_pytest_alone(tmp_path: Path) -> None:
    root = suite(tmp_path / "suite")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.module_queue"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout
    assert "8 passed" in done.stdout
    assert "module queue" not in done.stdout


@pytest.mark.parametrize("value", ["", "no-such-directory"])
def test_an_empty_or_missing_queue_directory_is_refused(tmp_path: Path, value: str) -> None:
    """``--module-queue=$DIR`` with DIR unset would claim modules in the working directory."""
    root = suite(tmp_path / "suite")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.module_queue",
                           f"--module-queue={value}"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode != 0, done.stdout
    assert "give an existing directory the runs share" in done.stdout + done.stderr
