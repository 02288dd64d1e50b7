"""The README a user opens first: its opening commands, and links that lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def test_the_first_lines_are_the_two_commands_for_a_fresh_machine() -> None:
    lines = README.read_text().splitlines()
    assert lines[0] == "# gpupool"
    block = lines[lines.index("```bash") + 1:lines.index("```")]
    assert lines.index("```bash") <= 3
    assert block[0].startswith("python3 -m pip install . && gpupool shim build; gpupool simulate")
    assert block[1].startswith("./scripts/test-all")
    assert len(block) == 2


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    ci = REPO / ".ci" / "run"
    if not ci.exists():
        pytest.skip(".ci/run is not in this checkout")
    assert "exec ./scripts/test-all" in ci.read_text()


@pytest.mark.parametrize("document", ["README.md", "docs/development.md", "docs/simulator.md", "docs/testenv.md"])
def test_relative_links_point_at_files_and_headings_that_exist(document: str) -> None:
    path = REPO / document
    text = path.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        assert linked.exists(), f"{document}: link to {target}: no such file"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked.read_text()), f"{document}: link to {target}: no such heading"


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors
