"""Fixtures of the library's tests: each runs once plain and once sanitized (the session's builds,
:mod:`tests.shim.library_fixtures`), on a machine of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.shim.build import RELEASE, SANITIZED
from tests.shim.toolchain import Toolchain

FLAVOURS = {"plain": RELEASE, "asan": SANITIZED}


@pytest.fixture(params=sorted(FLAVOURS), ids=lambda name: name)
def tc(request: pytest.FixtureRequest) -> Toolchain:
    """Each library test runs once plain and once sanitized."""
    return request.getfixturevalue("plain" if request.param == "plain" else "sanitized")


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    """A machine of its own: stand-in state file and container directory."""
    return tmp_path
