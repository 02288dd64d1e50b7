"""Session fixtures: the library and its test programs, plain and under AddressSanitizer +
UndefinedBehaviorSanitizer, built once per session into a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.shim.build import RELEASE, SANITIZED, Flavour, ShimBuildError, find_compiler
from tests.shim.toolchain import Toolchain, build_toolchain

FLAVOURS = {"plain": RELEASE, "asan": SANITIZED}


def _build(factory: pytest.TempPathFactory, flavour: Flavour) -> Toolchain:
    try:
        find_compiler()
    except ShimBuildError as exc:
        pytest.skip(f"cannot build the interception library here: {exc}")
    return build_toolchain(flavour, factory.mktemp(f"shim-{flavour.name}"))  # a compile error fails


@pytest.fixture(scope="session")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Toolchain:
    """The library as nodes run it."""
    return _build(tmp_path_factory, RELEASE)


@pytest.fixture(scope="session")
def sanitized(tmp_path_factory: pytest.TempPathFactory) -> Toolchain:
    """The library, the driver and the programs built with ASan and UBSan."""
    return _build(tmp_path_factory, SANITIZED)


@pytest.fixture(params=sorted(FLAVOURS), ids=lambda name: name)
def tc(request: pytest.FixtureRequest) -> Toolchain:
    """Each library test runs once plain and once sanitized."""
    return request.getfixturevalue("plain" if request.param == "plain" else "sanitized")


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    """A machine of its own: stand-in state file and container directory."""
    return tmp_path
