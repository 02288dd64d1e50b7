"""bench/extender_binds.py: it finds the testenv binaries where the build puts them, and never
passes off a figure from the in-process fake API as one from the real apiserver."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import gpupool.testenv.build as testenv_build
import gpupool.testenv.controlplane as testenv_controlplane
import gpupool.testenv.gobuild as testenv_gobuild
from gpupool.testenv.paths import CACHE_ENV, Binaries

ROOT = Path(__file__).resolve().parents[2]


@cache
def _bench() -> ModuleType:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the bench imports its siblings as bench.*
    spec = importlib.util.spec_from_file_location("bench.extender_binds", ROOT / "bench" / "extender_binds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its data classes look their module up there
    spec.loader.exec_module(module)
    return module


class _Started(Exception):
    """Raised by the stand-in control plane: carries the binaries it was started with."""

    def __init__(self, binaries: Binaries) -> None:
        super().__init__("started")
        self.binaries = binaries


def _executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


@pytest.fixture
def built_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Binaries:
    """A testenv cache as the build leaves it (the build's compile step replaced by a stand-in
    that writes an executable per program)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    source = tmp_path / "kubernetes-source"
    source.mkdir()
    (source / "go.mod").write_text("module k8s.io/kubernetes\n\ngo 1.26.0\n\nrequire (\n\tk8s.io/api v0.0.0\n)\n")

    def compile_stand_in(cmd: list[str], log_path: Path, **_: Any) -> None:
        output = cmd[cmd.index("-o") + 1]
        for package in cmd[cmd.index("-o") + 2:]:
            _executable(Path(output) / package.rsplit("/", 1)[-1] if output.endswith("/") else Path(output))

    monkeypatch.setattr(testenv_gobuild, "run_step", compile_stand_in)
    monkeypatch.setattr(testenv_gobuild, "toolchain_problem", lambda: None)
    monkeypatch.setattr(testenv_build, "toolchain_problem", lambda: None)
    monkeypatch.setattr(testenv_build, "kubernetes_source", lambda rel, log: source)
    monkeypatch.setattr(testenv_build, "_cached_mod_file", lambda module, version: source / "go.mod")
    return testenv_build.ensure_binaries()


def _refuse_to_start(binaries: Binaries, **_: Any) -> None:
    raise _Started(binaries)


def test_the_real_apiserver_is_found_where_the_build_put_its_binaries(
        built_cache: Binaries, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testenv_controlplane, "start_control_plane", _refuse_to_start)
    with pytest.raises(_Started) as started:
        _bench().real_backend(build=False)
    assert started.value.binaries == built_cache
    assert started.value.binaries.kube_apiserver.parent.parent.name.startswith("kubernetes-v1.")


def test_auto_falls_back_to_the_fake_api_loudly_and_says_so_in_the_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty"))
    stats = _bench().binds(40, 4, 8, "auto", random.Random(1))
    err = capsys.readouterr().err
    assert "NOT a real apiserver" in err and "not built" in err
    assert stats["apiserver"] == "fake"
    assert "FakePodApi" in stats["binds_against"] and "no real apiserver" in stats["binds_against"]
    assert stats["double_booked_cards"] == 0 and stats["binds_ok"] + stats["binds_refused"] == 40


def test_real_without_a_buildable_apiserver_stops_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty"))
    monkeypatch.setattr(testenv_build, "build_impossible_reason", lambda: "no Go here")
    with pytest.raises(SystemExit, match="--apiserver real: no real apiserver: no Go here"):
        _bench().binds(40, 4, 8, "real", random.Random(1))


@pytest.mark.slow
@pytest.mark.parametrize("writes", [pytest.param("1", id="assignment-in-binding"),
                                    pytest.param("2", id="patch-then-binding")])
def test_the_bench_prints_the_api_it_used_in_the_table_and_the_json(writes: str) -> None:
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "extender.py"), "--binds-only", "--apiserver",
                          "fake", "--binds", "60", "--bind-writes", writes, "--json"],
                         capture_output=True, text=True, check=True, env=env, cwd=ROOT).stdout
    table, line = out.rsplit("\n", 2)[0], out.strip().splitlines()[-1]
    stats = json.loads(line)
    assert stats["apiserver"] == "fake" and stats["bind_writes"] == int(writes)
    assert "apiserver (binds against)" in table and "fake: in-process FakePodApi" in table
    assert stats["double_booked_cards"] == 0
