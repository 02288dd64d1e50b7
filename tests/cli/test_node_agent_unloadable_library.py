"""A hand-run ``gpupool node-agent`` whose interception library cannot be loaded takes whole cards only
(docs/isolation.md): the start-up check's load verdict reaches the backend the agent runs with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpupool.cli import node_agent_cmd
from gpupool.cli.main import cli
from gpupool.nodeagent.isolation.backends import IsolationBackend
from gpupool.nodeagent.isolation.setup import IsolationConfig
from gpupool.nodeagent.options import AgentOptions


def started_isolation(monkeypatch: pytest.MonkeyPatch, *flags: str) -> IsolationConfig:
    seen: dict[str, Any] = {}

    async def fake_run(options: AgentOptions) -> None:
        seen["isolation"] = options.isolation

    monkeypatch.setattr(node_agent_cmd, "run_agent", fake_run)
    result = CliRunner().invoke(cli, ["node-agent", "--no-usage-monitor", "--no-exit-on-failed-check", *flags])
    assert result.exit_code == 0, result.output
    config = seen["isolation"]
    assert isinstance(config, IsolationConfig)
    return config


@pytest.mark.parametrize("isolation", ["auto", "shim"])
def test_an_unloadable_library_leaves_the_agent_without_shares(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, isolation: str) -> None:
    library = tmp_path / "libgpupool.so"
    library.write_text("not a library")
    choice = started_isolation(monkeypatch, "--isolation", isolation, "--shim-library", str(library)).choice()
    assert (choice.backend, choice.shares) == (IsolationBackend.NONE, False)
    assert "cannot be loaded (not a 64-bit little-endian ELF shared object)" in choice.reason


def test_the_admins_explicit_none_still_shares_unenforced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    library = tmp_path / "libgpupool.so"
    library.write_text("not a library")
    choice = started_isolation(monkeypatch, "--isolation", "none", "--shim-library", str(library)).choice()
    assert (choice.backend, choice.shares) == (IsolationBackend.NONE, True)
