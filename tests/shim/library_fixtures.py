"""The interception library and its test programs, plain and under AddressSanitizer +
UndefinedBehaviorSanitizer, built once per session into a temporary directory.

Session fixtures of the whole suite (tests/conftest.py imports them), not of tests/shim alone: a
module elsewhere that runs the library (the owner watch's region test) once built its own copy,
~15 s of compiling on two busy cores for the same files."""

from __future__ import annotations

import pytest

from gpupool.shim.build import RELEASE, SANITIZED, Flavour, ShimBuildError, find_compiler
from tests.shim.toolchain import Toolchain, build_toolchain


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
