"""Without the node's grant (HAMi-style pods: limits only in the environment), a child started
with a cleared or edited environment is bound by what its ancestors were started with, and shares
their account."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.shim.toolchain import RUN_TIMEOUT_S, Holder, Toolchain, assert_clean, codes, parse_steps, run_probe

OK, OUT_OF_MEMORY = 0, 2
GIB = 1 << 30
MACHINE = ("LD_PRELOAD", "LD_LIBRARY_PATH", "GPUPOOL_STANDIN_STATE", "ASAN_OPTIONS", "UBSAN_OPTIONS", "PATH")


def hami_env(tc: Toolchain, work: Path, **variables: str) -> dict[str, str]:
    """A HAMi-style container: CUDA_DEVICE_MEMORY_LIMIT, no gpupool region directory named."""
    env = tc.env(work, CUDA_DEVICE_MEMORY_LIMIT="4g", **variables)
    del env["GPUPOOL_SHIM_DIR"]
    return env


def test_a_child_with_a_cleared_environment_shares_its_parents_account(tc: Toolchain, work: Path) -> None:
    """The probe's finding: the child got the whole card while its parent held 4 GiB. With the
    region in the per-user fallback directory, as a HAMi-style pod has it."""
    steps, _ = run_probe(tc, hami_env(tc, work), "symbol", "alloc:4g", "child:alloc:1m+info+alloc:16g")
    assert codes(steps) == [OK, 0, OUT_OF_MEMORY, OK, OUT_OF_MEMORY]  # "child 0": it exited 0
    assert steps[3].values == ("0", str(4 * GIB))


def test_a_child_finds_the_region_its_ancestor_names(tc: Toolchain, work: Path) -> None:
    parent = Holder(tc, tc.env(work, CUDA_DEVICE_MEMORY_LIMIT="4g"), "alloc:3g")
    try:
        parent.wait_ready()
        # A child of another process of the container: its own parent (this probe) holds nothing.
        steps, _ = run_probe(tc, tc.env(work, CUDA_DEVICE_MEMORY_LIMIT="4g"), "symbol",
                             "child:info+alloc:2g+alloc:1g")
        assert codes(steps) == [0, OK, OUT_OF_MEMORY, OK]
        assert steps[1].values == (str(GIB), str(4 * GIB))
    finally:
        parent.kill()


def test_a_child_cannot_raise_disable_or_move_what_its_ancestors_started_with(tc: Toolchain, work: Path) -> None:
    limited = hami_env(tc, work)
    (work / "fresh").mkdir()
    own = [f"{k}={v}" for k, v in limited.items() if k in MACHINE]
    raised = [*own, "CUDA_DEVICE_MEMORY_LIMIT=64g", "GPUPOOL_MEMORY_LIMIT_MIB=999999", "GPUPOOL_SHIM_DISABLE=1",
              f"GPUPOOL_SHIM_DIR={work / 'fresh'}"]
    # sh is the parent, started with the container's environment; env -i gives its child another.
    done = subprocess.run(["sh", "-c", 'env -i "$@"; exit $?', "sh", *raised, str(tc.probe), "symbol", "info",
                           "alloc:5g", "alloc:4g"], env=limited, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)
    assert_clean(done.stderr)
    assert done.returncode == 0, done.stderr
    steps = parse_steps(done.stdout)
    assert codes(steps) == [OK, OUT_OF_MEMORY, OK]
    assert steps[0].values == (str(4 * GIB), str(4 * GIB))
    assert "is ignored: ancestor" in done.stderr
    assert not (work / "fresh" / "memory.region").exists()


def test_an_ancestor_started_without_limits_binds_nothing(tc: Toolchain, work: Path) -> None:
    """Outside containers and in pods without limits nothing changes: the library stays a
    pass-through for a child whose ancestors declared nothing."""
    env = {k: v for k, v in tc.env(work).items() if k != "GPUPOOL_SHIM_DIR"}
    steps, _ = run_probe(tc, env, "symbol", "child:alloc:16g")
    assert codes(steps) == [0, OK]
