"""VMM allocations live while anything refers to them: a handle (created, imported, retained), a
mapping, an open exported file. The charge goes with the last reference, so releasing the first
handle of memory that is still mapped or imported keeps it counted, and a process cannot export
memory to itself and release the original to hold it uncharged (docs/isolation.md, "VMM
allocations"). Plain and under ASan+UBSan, through each way a program reaches the driver."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest

from tests.shim.toolchain import RUN_TIMEOUT_S, Holder, Toolchain, assert_clean, codes, parse_steps, run_probe

OK, OUT_OF_MEMORY = 0, 2
MIB, GIB = 1 << 20, 1 << 30
MODES = ["symbol", "dlsym", "procaddress"]


SYS_PIDFD_GETFD = 438  # x86-64 and arm64


def free_of(step_values: tuple[str, ...]) -> int:
    return int(step_values[0])


def take_descriptor(pid: int, fd: int) -> int:
    """A copy of another process's descriptor, the same open file (as SCM_RIGHTS would pass it;
    reopening /proc/<pid>/fd/<fd> would make a new one, which an exported file is not)."""
    pidfd = os.pidfd_open(pid)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        copy = int(libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0))
        if copy < 0:
            pytest.skip(f"pidfd_getfd: {os.strerror(ctypes.get_errno())}")
        return copy
    finally:
        os.close(pidfd)


@pytest.mark.parametrize("mode", MODES)
def test_a_mapped_allocation_stays_charged_after_its_handle_is_released(tc: Toolchain, work: Path,
                                                                       mode: str) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, "create:768m", "map:0:768m", "release:0", "info", "alloc:512m",
                         "used", "unmap:1:768m", "info", "used")
    assert codes(steps) == [OK, OK, OK, OK, OUT_OF_MEMORY, OK, OK, OK, OK]
    assert free_of(steps[3].values) == 256 * MIB
    assert steps[5].values == (str(768 * MIB),)  # the card still holds it: so does the budget
    assert free_of(steps[7].values) == GIB  # the last mapping gone, the charge goes
    assert steps[8].values == ("0",)


@pytest.mark.parametrize("mode", MODES)
def test_exporting_to_itself_does_not_free_the_charge(tc: Toolchain, work: Path, mode: str) -> None:
    """The bypass: export, import the file again, release the original. The import is the same
    allocation, so it stays charged until the import, too, is released. Every exported file is an
    open of the same file (as every driver export is of /dev/nvidiactl)."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, "create:768m", "export:0", "import:1", "release:0", "info",
                         "alloc:512m", "used", "close:1", "release:2", "info", "used")
    assert codes(steps) == [OK, OK, OK, OK, OK, OUT_OF_MEMORY, OK, OK, OK, OK, OK]
    assert free_of(steps[4].values) == 256 * MIB  # one allocation, charged once, still held
    assert steps[6].values == (str(768 * MIB),)
    assert free_of(steps[9].values) == GIB
    assert steps[10].values == ("0",)


@pytest.mark.parametrize("mode", MODES)
def test_an_open_exported_file_keeps_the_allocation_charged(tc: Toolchain, work: Path, mode: str) -> None:
    """The driver keeps memory alive while a file exported from it is open, without any handle."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, "create:768m", "export:0", "release:0", "create:512m", "used",
                         "close:1", "create:512m", "info", "used")
    assert codes(steps) == [OK, OK, OK, OUT_OF_MEMORY, OK, OK, OK, OK, OK]
    assert steps[4].values == (str(768 * MIB),)
    assert free_of(steps[7].values) == 512 * MIB  # the file closed, the 768 MiB went back
    assert steps[8].values == (str(512 * MIB),)


@pytest.mark.parametrize("mode", MODES)
def test_a_retained_handle_keeps_the_allocation_charged(tc: Toolchain, work: Path, mode: str) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, "create:768m", "map:0:768m", "retain:1", "unmap:1:768m", "release:0",
                         "info", "release:2", "info", "used")
    assert codes(steps) == [OK] * 9
    assert free_of(steps[5].values) == 256 * MIB
    assert free_of(steps[7].values) == GIB
    assert steps[8].values == ("0",)


def test_without_a_limit_vmm_calls_pass_through(tc: Toolchain, work: Path) -> None:
    steps, _ = run_probe(tc, tc.env(work), "procaddress", "create:768m", "export:0", "import:1", "map:2:768m",
                         "release:0", "release:2", "unmap:3:768m", "close:1", "create:1m", "used")
    assert codes(steps) == [OK] * 10
    assert steps[9].values == (str(MIB),)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_another_containers_export_is_charged_once_to_the_importer_as_it_maps(tc: Toolchain, work: Path,
                                                                              mode: str) -> None:
    """Memory another process exported is charged where it is mapped, by what is mapped, and only
    once however often it is mapped; the exporter's container keeps its own charge."""
    exporter_dir, importer_dir = work / "a", work / "b"
    exporter_dir.mkdir()
    importer_dir.mkdir()
    holder = Holder(tc, tc.env(exporter_dir, GPUPOOL_MEMORY_LIMIT_MIB="1024"), "create:768m", "export:0")
    try:
        exported = holder.wait_ready()
        fd = take_descriptor(holder.process.pid, int(exported[1].values[1]))
        try:
            env = tc.env(importer_dir, GPUPOOL_MEMORY_LIMIT_MIB="1024")
            done = subprocess.run([str(tc.probe), mode, f"importfd:{fd}", "info", "map:0:768m", "map:0:768m",
                                   "info", "alloc:512m", "unmap:1:768m", "unmap:2:768m", "release:0", "info"],
                                  env=env, pass_fds=(fd,), capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                                  check=False)
        finally:
            os.close(fd)
        assert_clean(done.stderr)
        steps = parse_steps(done.stdout)
        assert codes(steps) == [OK, OK, OK, OK, OK, OUT_OF_MEMORY, OK, OK, OK, OK], done.stderr
        assert free_of(steps[1].values) == GIB  # importing alone reaches nothing
        assert free_of(steps[4].values) == 256 * MIB  # mapped twice, charged once
        assert free_of(steps[9].values) == GIB
    finally:
        holder.kill()


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_many_mapped_allocations_are_counted_and_given_back(tc: Toolchain, work: Path, mode: str) -> None:
    """A framework maps thousands of small VMM pages (the library's tables grow meanwhile)."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="2048")
    steps, _ = run_probe(tc, env, mode, "vmmgrab:1500:1m", "info", "alloc:1g", "vmmdrop", "info", "used")
    assert codes(steps) == [OK, OK, OUT_OF_MEMORY, OK, OK, OK]
    assert steps[0].values == ("1500",)
    assert free_of(steps[1].values) == (2048 - 1500) * MIB
    assert free_of(steps[4].values) == 2 * GIB
    assert steps[5].values == ("0",)


@pytest.mark.parametrize("mode", MODES)
def test_each_export_is_told_apart_though_all_are_opens_of_one_file(tc: Toolchain, work: Path, mode: str) -> None:
    """Two allocations exported (both files opens of the same file, like the driver's): importing
    the second and releasing its original keeps the second charged, not the first."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, "create:256m", "create:512m", "export:0", "export:1", "import:3",
                         "release:1", "info", "close:2", "close:3", "release:0", "info", "release:4", "info", "used")
    assert codes(steps) == [OK] * 14
    assert free_of(steps[6].values) == 256 * MIB  # both still held: the first by its handle
    assert free_of(steps[10].values) == 512 * MIB  # the first went with its handle and file
    assert free_of(steps[12].values) == GIB
    assert steps[13].values == ("0",)
