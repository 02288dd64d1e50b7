"""Lookups that used to reach the driver unwrapped (issue 28's probe): dlsym fetched from libc's
own handle, dlsym fetched with dlvsym, and the driver loaded into a new link-map namespace with
dlmopen and looked up with that namespace's own dlsym. Each now gets the wrappers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.shim.toolchain import Toolchain, codes, run_probe

OK, OUT_OF_MEMORY = 0, 2
GIB = 1 << 30


@pytest.mark.parametrize("mode", ["libcdlsym", "vdlsym", "mopen"])
def test_a_lookup_around_the_library_still_gets_the_limits(tc: Toolchain, work: Path, mode: str) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    steps, _ = run_probe(tc, env, mode, "total", "alloc:4g", "alloc:1")
    assert steps[0].values == (str(4 * GIB),)
    assert codes(steps)[1:] == [OK, OUT_OF_MEMORY]


def test_the_driver_asked_for_in_a_new_namespace_is_the_base_namespace_one(tc: Toolchain, work: Path) -> None:
    done = run_probe(tc, tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096", GPUPOOL_SHIM_LOG="info"), "mopen", "total")
    _, stderr = done
    assert "loaded in the base namespace" in stderr


def test_without_limits_lookups_of_lookups_are_glibc_s(tc: Toolchain, work: Path) -> None:
    """A pass-through library changes nothing, dlmopen namespaces included (plain only: the
    sanitized driver cannot start in a second namespace, the sanitizer runtime not being first there)."""
    if tc.flavour != "release":
        pytest.skip("AddressSanitizer cannot run in a second link-map namespace")
    steps, stderr = run_probe(tc, tc.env(work), "mopen", "alloc:10g")
    assert codes(steps) == [OK]
    assert stderr == ""


def test_a_renamed_driver_in_a_new_namespace_is_refused(tc: Toolchain, work: Path) -> None:
    """Recognised by what it defines, not by its name (plain only, as above)."""
    if tc.flavour != "release":
        pytest.skip("AddressSanitizer cannot run in a second link-map namespace")
    copy = work / "libquiet.so"
    shutil.copy(tc.standin / "libcuda.so.1", copy)
    steps, stderr = run_probe(tc, tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096"), "symbol", f"nsload:{copy}",
                              f"nsload:{tc.interposer}")
    assert codes(steps) == [1, 0]  # the copy refused, an ordinary library loaded
    assert "refused: it loads a GPU driver into another namespace" in stderr
