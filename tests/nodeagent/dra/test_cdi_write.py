"""A claim's CDI spec is written without checking its directory first (100 prepares at once wrote
100 specs, each with a mkdir attempt), and the directory is still made when it is missing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from gpupool.nodeagent.dra.cdi import CdiSpecs
from gpupool.nodeagent.types import ContainerGrant


def test_the_directory_is_made_when_missing_and_again_when_removed(tmp_path: Path) -> None:
    specs = CdiSpecs(str(tmp_path / "run" / "cdi"), "gpupool.io")
    assert specs.write("uid-1", ContainerGrant({}, ())) == "gpupool.io/claim=uid-1"
    shutil.rmtree(tmp_path / "run")
    specs.write("uid-2", ContainerGrant({}, ()))
    assert os.listdir(specs.directory) == [os.path.basename(specs.path("uid-2"))]
    assert json.loads(Path(specs.path("uid-2")).read_text())["devices"][0]["name"] == "uid-2"


def test_a_write_into_an_existing_directory_makes_no_directory_call(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    specs = CdiSpecs(str(tmp_path), "gpupool.io")
    calls: list[str] = []
    monkeypatch.setattr(os, "makedirs", lambda *a, **k: calls.append(str(a[0])))
    for i in range(3):
        specs.write(f"uid-{i}", ContainerGrant({}, ()))
    assert calls == [] and len(os.listdir(tmp_path)) == 3
