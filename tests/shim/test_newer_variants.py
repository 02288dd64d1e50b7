"""A driver newer than the interception library (issues 26 and 28): the stand-in exports
``cuMemAlloc_v3``, a variant no gpupool release wraps, and hands it out through cuGetProcAddress
for "cuMemAlloc" from CUDA version 99000 (``STANDIN_FUTURE_VERSION``). The library must hand out
neither its ``cuMemAlloc_v2`` wrapper (the wrong arguments) nor the driver's function (past the
memory limit): the lookup is refused as the driver refuses a name it does not know, and so is a
``dlsym`` of the new name. Lookups the library knows keep their wrappers, and the limit holds."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from tests.shim.toolchain import RUN_TIMEOUT_S, Step, Toolchain, assert_clean, parse_steps

OK, OUT_OF_MEMORY, NOT_FOUND = 0, 2, 500
SYMBOL_NOT_FOUND = 1  # CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
FUTURE = 99000  # the stand-in's STANDIN_FUTURE_VERSION
KNOWN = 12080
PAST_CHECKED = 13050  # newer than the library's table (13000), older than the new variant
REFUSAL = "refused: the driver has cuMemAlloc_v3, newer than cuMemAlloc_v2"
NOTHING_TO_CALL = -1


def run_lookup(tc: Toolchain, env: Mapping[str, str], *steps: str) -> tuple[list[Step], str]:
    done = subprocess.run([str(tc.lookup), *steps], env=dict(env), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)
    assert_clean(done.stderr)
    assert done.returncode == 0, f"lookup failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return parse_steps(done.stdout), done.stderr


def limited(tc: Toolchain, work: Path, **variables: str) -> dict[str, str]:
    return tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096", **variables)


def test_the_lookup_at_the_new_version_is_refused_and_the_known_one_wrapped(tc: Toolchain, work: Path) -> None:
    steps, stderr = run_lookup(tc, limited(tc, work), f"proc:cuMemAlloc:{FUTURE}", "alloc:5g",
                               f"proc1:cuMemAlloc:{FUTURE}", "alloc:5g",
                               f"proc:cuMemAlloc:{KNOWN}", "alloc:5g", "used")
    assert steps[0].code == NOT_FOUND and steps[0].values == (str(SYMBOL_NOT_FOUND), "none", "?")
    assert steps[2].code == NOT_FOUND and steps[2].values == ("none", "?")
    assert [steps[1].code, steps[3].code] == [NOTHING_TO_CALL, NOTHING_TO_CALL]
    assert steps[4].code == OK and steps[4].values == ("0", "library", "cuMemAlloc_v2")
    assert steps[5].code == OUT_OF_MEMORY  # the limit holds through the known variant's wrapper
    assert steps[6].values == ("0",)
    assert stderr.count(REFUSAL) == 1  # once, naming the entry point and the version asked
    assert f"cuGetProcAddress of cuMemAlloc at CUDA version {FUTURE} refused" in stderr


def test_entry_points_that_did_not_change_keep_their_wrappers_at_the_new_version(tc: Toolchain,
                                                                                  work: Path) -> None:
    steps, stderr = run_lookup(tc, limited(tc, work), f"proc:cuMemGetInfo:{FUTURE}", f"proc:cuMemFree:{FUTURE}",
                               f"proc:cuMemAllocAsync:{FUTURE}")
    assert [s.values for s in steps] == [("0", "library", "cuMemGetInfo_v2"), ("0", "library", "cuMemFree_v2"),
                                         ("0", "library", "cuMemAllocAsync")]
    assert "refused" not in stderr


def test_a_driver_answering_with_internal_addresses(tc: Toolchain, work: Path) -> None:
    """The answer matches no exported entry point: at a version the library knows, or past it while
    the driver still answers as at the newest version it knows, the wrapper by name; the new
    variant (another answer than at that version) is refused."""
    env = limited(tc, work, GPUPOOL_STANDIN_PROC_INTERNAL="1")
    steps, stderr = run_lookup(tc, env, f"proc:cuMemAlloc:{KNOWN}", "alloc:5g", f"proc:cuMemAlloc:{PAST_CHECKED}",
                               f"proc:cuMemAlloc:{FUTURE}", "alloc:5g", "used")
    assert steps[0].values == ("0", "library", "cuMemAlloc_v2") and steps[1].code == OUT_OF_MEMORY
    assert steps[2].values == ("0", "library", "cuMemAlloc_v2")
    assert steps[3].code == NOT_FOUND and steps[3].values == (str(SYMBOL_NOT_FOUND), "none", "?")
    assert steps[4].code == NOTHING_TO_CALL
    assert steps[5].values == ("0",)
    assert REFUSAL in stderr


def test_dlsym_of_the_new_variant_gives_nothing(tc: Toolchain, work: Path) -> None:
    """By its suffixed name the driver's own would be unwrapped: NULL, as if the driver lacked it
    (dlvsym goes the same way; the stand-in's symbols have no version dlvsym could name)."""
    steps, stderr = run_lookup(tc, limited(tc, work), "dlsym:cuMemAlloc_v3", "alloc:5g", "dlsym:cuMemAlloc_v3",
                               "dlsym:cuMemAlloc_v2", "alloc:5g", "used")
    assert [s.code for s in steps[:3]] == [NOT_FOUND, NOTHING_TO_CALL, NOT_FOUND]
    assert steps[3].values == ("library", "cuMemAlloc_v2") and steps[4].code == OUT_OF_MEMORY
    assert steps[5].values == ("0",)
    assert stderr.count("dlsym of cuMemAlloc_v3 refused") == 1


def test_dlsym_of_suffixed_names_the_library_does_not_wrap_reaches_the_driver(tc: Toolchain, work: Path) -> None:
    """Only a base name the library wraps is guarded: other _v2 entry points stay the driver's."""
    steps, stderr = run_lookup(tc, limited(tc, work), "dlsym:cuStreamBeginCapture_v2", "dlsym:cuIpcOpenMemHandle_v2",
                               "dlsym:cuCtxPopCurrent_v2")
    assert [s.values for s in steps] == [("driver", "cuStreamBeginCapture_v2"), ("driver", "cuIpcOpenMemHandle_v2"),
                                         ("driver", "cuCtxPopCurrent_v2")]
    assert "refused" not in stderr


def test_without_limits_the_driver_answers(tc: Toolchain, work: Path) -> None:
    """A pass-through library refuses nothing: the program gets what the driver hands out."""
    steps, stderr = run_lookup(tc, tc.env(work), f"proc:cuMemAlloc:{FUTURE}", "dlsym:cuMemAlloc_v3", "alloc:1m")
    assert steps[0].values == ("0", "driver", "cuMemAlloc_v3")
    assert steps[1].values == ("driver", "cuMemAlloc_v3") and steps[2].code == OK
    assert "refused" not in stderr


def test_cuda_13_4_s_cuGraphAddNode_v3_has_its_wrapper(tc: Toolchain, work: Path) -> None:
    """A variant a real driver has (the CUDA 13.4 driver API's cuGraphAddNode_v3, the arguments of
    _v2): wrapped, so the guard does not refuse it, and its memory nodes are charged."""
    steps, stderr = run_lookup(tc, limited(tc, work), "proc:cuGraphAddNode:13040", "gnode:5g", "gnode:1g",
                               "proc:cuGraphAddNode:12080", "dlsym:cuGraphAddNode_v3", "used")
    assert steps[0].values == ("0", "library", "cuGraphAddNode_v3")
    assert [steps[1].code, steps[2].code] == [OUT_OF_MEMORY, OK]
    assert steps[3].values == ("0", "library", "cuGraphAddNode_v2")
    assert steps[4].values == ("library", "cuGraphAddNode_v3")
    assert steps[5].values == (str(1 << 30),)
    assert "refused" not in stderr
