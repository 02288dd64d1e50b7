"""bench/dra_prepare.py drives the DRA plugin from a Go client, as kubelet is (its figures carry
no Python client's CPU), and says so, or measures with the Python client and says why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import dra_prepare, dra_prepare_go
from gpupool.testenv.gobuild import toolchain_problem

ROOT = Path(__file__).resolve().parents[2]


def test_auto_falls_back_to_the_python_client_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(dra_prepare_go, "unavailable", lambda: "Go not found")
    assert dra_prepare.chosen_client("auto") == "python"
    assert "Go not found" in capsys.readouterr().err
    assert dra_prepare.chosen_client("go") == "go"


def test_auto_takes_the_go_client_where_it_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dra_prepare_go, "unavailable", lambda: None)
    assert dra_prepare.chosen_client("auto") == "go"


@pytest.mark.slow  # builds the client once (cached), starts the plugin twice
@pytest.mark.parametrize("client", ["go", "python"])
def test_each_client_prints_the_percentiles(client: str) -> None:
    if client == "go" and toolchain_problem() is not None:
        pytest.skip(f"no Go here: {toolchain_problem()}")
    done = subprocess.run([sys.executable, "bench/dra_prepare.py", "--claims", "10", "--client", client, "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["client"] == client and out["claims"] == 10
    assert 0 < out["prepare_p50_ms"] <= out["prepare_p99_ms"]
    assert 0 < out["unprepare_p50_ms"] <= out["unprepare_p99_ms"]
