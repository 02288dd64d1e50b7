"""Memory limits inside one process: refusals, reports, releases, every allocation kind, and the
three ways a program reaches the driver (by symbol, dlsym, cuGetProcAddress_v2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shim.toolchain import Toolchain, codes, run_probe

OK, OUT_OF_MEMORY = 0, 2
MIB, GIB = 1 << 20, 1 << 30
CARD_BYTES = 16 * GIB  # the stand-in driver's default card


@pytest.mark.parametrize("mode", ["symbol", "dlsym", "procaddress"])
def test_allocation_beyond_the_limit_fails_with_out_of_memory(tc: Toolchain, work: Path, mode: str) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    steps, _ = run_probe(tc, env, mode, "alloc:3g", "alloc:2g", "alloc:1g", "alloc:1")
    assert codes(steps) == [OK, OUT_OF_MEMORY, OK, OUT_OF_MEMORY]


@pytest.mark.parametrize("mode", ["symbol", "procaddress"])
def test_memory_reports_show_the_limit_and_what_is_left(tc: Toolchain, work: Path, mode: str) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    steps, _ = run_probe(tc, env, mode, "info", "alloc:1g", "info", "total")
    assert steps[0].values == (str(4 * GIB), str(4 * GIB))  # free, total
    assert steps[2].values == (str(3 * GIB), str(4 * GIB))
    assert steps[3].values == (str(4 * GIB),)


def test_freed_memory_returns_to_the_budget(tc: Toolchain, work: Path) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, "symbol", "alloc:1g", "alloc:1m", "free:0", "alloc:1g", "info")
    assert codes(steps) == [OK, OUT_OF_MEMORY, OK, OK, OK]
    assert steps[-1].values[0] == "0"


# Each kind fills a 64 MiB budget, so one more byte is refused; its release gives it back.
KINDS = [
    pytest.param("alloc:64m", "free:0", id="cuMemAlloc"),
    pytest.param("managed:64m", "free:0", id="cuMemAllocManaged"),
    pytest.param("pitch:65536x1024", "free:0", id="cuMemAllocPitch"),
    pytest.param("create:64m", "release:0", id="cuMemCreate"),
    pytest.param("async:64m", "freeasync:0", id="cuMemAllocAsync"),
    pytest.param("pool:64m", "free:0", id="cuMemAllocFromPoolAsync"),
    pytest.param("array:4096x4096", "destroy:0", id="cuArrayCreate"),
    pytest.param("array3d:1024x1024x16", "destroy:0", id="cuArray3DCreate"),
    pytest.param("mipmap:4096x2048x2", "unmip:0", id="cuMipmappedArrayCreate"),  # 32 MiB + 8 MiB
    pytest.param("alloc1:64m", "free1:0", id="cuMemAlloc-v1"),
    pytest.param("pitch1:65536x1024", "free1:0", id="cuMemAllocPitch-v1"),
    pytest.param("array1:4096x4096", "destroy:0", id="cuArrayCreate-v1"),
    pytest.param("array3d1:1024x1024x16", "destroy:0", id="cuArray3DCreate-v1"),
    pytest.param("extimport:64m", "extdel:0", id="cuImportExternalMemory"),
]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["symbol", "dlsym", "procaddress"])
@pytest.mark.parametrize(("allocate", "release"), KINDS)
def test_every_allocation_kind_is_counted_and_given_back(tc: Toolchain, work: Path, allocate: str,
                                                          release: str, mode: str) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="64")
    steps, _ = run_probe(tc, env, mode, allocate, "alloc:32m", release, "alloc:32m", "info")
    assert codes(steps) == [OK, OUT_OF_MEMORY, OK, OK, OK]
    assert steps[-1].values == (str(32 * MIB), str(64 * MIB))


HAMI = [
    pytest.param({"CUDA_DEVICE_MEMORY_LIMIT": "1g"}, GIB, id="all-cards-g"),
    pytest.param({"CUDA_DEVICE_MEMORY_LIMIT": "1024m"}, GIB, id="all-cards-m"),
    pytest.param({"CUDA_DEVICE_MEMORY_LIMIT": "1048576k"}, GIB, id="all-cards-k"),
    pytest.param({"CUDA_DEVICE_MEMORY_LIMIT": str(GIB)}, GIB, id="all-cards-bytes"),
    pytest.param({"CUDA_DEVICE_MEMORY_LIMIT": "4g", "CUDA_DEVICE_MEMORY_LIMIT_0": "512m"}, 512 * MIB,
                 id="per-card-wins"),
    pytest.param({"CUDA_DEVICE_MEMORY_LIMIT": "4g", "GPUPOOL_MEMORY_LIMIT_MIB": "256"}, 256 * MIB,
                 id="gpupool-contract-wins"),
]


@pytest.mark.parametrize(("variables", "limit"), HAMI)
def test_hami_core_variables_set_the_limit(tc: Toolchain, work: Path, variables: dict[str, str],
                                           limit: int) -> None:
    steps, _ = run_probe(tc, tc.env(work, **variables), "symbol", "info", f"alloc:{limit}", "alloc:1")
    assert steps[0].values == (str(limit), str(limit))
    assert codes(steps)[1:] == [OK, OUT_OF_MEMORY]


def test_without_limits_the_library_passes_everything_through(tc: Toolchain, work: Path) -> None:
    steps, stderr = run_probe(tc, tc.env(work), "procaddress", "info", "alloc:10g", "info")
    assert steps[0].values == (str(CARD_BYTES), str(CARD_BYTES))
    assert codes(steps) == [OK, OK, OK]
    assert steps[2].values == (str(CARD_BYTES - 10 * GIB), str(CARD_BYTES))
    assert stderr == ""


def test_disable_switch_turns_the_library_off_and_says_so(tc: Toolchain, work: Path) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024", GPUPOOL_SHIM_DISABLE="1")
    steps, stderr = run_probe(tc, env, "symbol", "alloc:2g")
    assert codes(steps) == [OK]
    assert stderr.count("GPUPOOL_SHIM_DISABLE=1") == 1


@pytest.mark.parametrize("value", ["abc", ",4096", "-1", "4096MiB"])
def test_an_unreadable_limit_refuses_allocations_instead_of_granting_the_card(tc: Toolchain, work: Path,
                                                                             value: str) -> None:
    steps, stderr = run_probe(tc, tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB=value), "symbol", "alloc:1m")
    assert codes(steps) == [OUT_OF_MEMORY]
    assert "GPUPOOL_MEMORY_LIMIT_MIB" in stderr


def test_dlsym_rtld_next_still_means_after_the_caller(tc: Toolchain, work: Path) -> None:
    """The library replaces dlsym; an interposer loaded after it must still find libc's function."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    env["LD_PRELOAD"] = f"{tc.preload} {tc.interposer}"
    steps, _ = run_probe(tc, env, "symbol", "ppid", "alloc:2g")
    assert int(steps[0].values[0]) > 1_000_000  # the interposer ran and reached the real getppid
    assert codes(steps)[1:] == [OUT_OF_MEMORY]
