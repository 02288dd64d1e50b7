"""The compute controller at a process's exit: once the library has left the container's region
(its destructor empties the process's slot), the controller thread still runs until the process is
gone, while the CUDA driver tears down. A measurement it took then found none of the container's
pids in the region and reported the container's own work as a neighbour's (issue 21: the host-pid
share test failed under load, where the exit of a sanitized program takes longer than a control
period)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from gpupool.shim.region import DeviceState, read_region
from tests.shim.toolchain import RUN_TIMEOUT_S, Toolchain, assert_clean

#: Twenty 100 ms kernels, queued at once (the queue holds them all): the card stays busy with the
#: program's work for two seconds, well past its exit, so every measurement taken while it exits
#: has the program's work in its window.
LONG_KERNELS = {"GPUPOOL_STANDIN_KERNEL_US": "100000", "GPUPOOL_STANDIN_QUEUE_US": "5000000"}
#: The stand-in driver's destructor waits for two more utilisation queries: the controller's
#: queries come one after another from one thread, so the first one's result has been stored (or
#: dropped) before the second begins, and the process cannot end before that.
TEARDOWN = {"GPUPOOL_STANDIN_TEARDOWN_QUERIES": "2"}
KERNELS = 20


def first_measurement(region: Path, program: subprocess.Popen[str]) -> DeviceState:
    """Wait until the controller has stored a measurement in which the container was busy."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline and program.poll() is None:
        if region.is_file():
            device = read_region(region).devices[0]
            if device.util_container_percent > 0:
                return device
        time.sleep(0.01)
    raise AssertionError(f"no measurement of the container's work (program: {program.poll()})")


def test_a_measurement_taken_after_the_process_left_the_region_is_not_reported(
        plain: Toolchain, work: Path) -> None:
    go = work / "go"
    env = {**plain.env(work, GPUPOOL_COMPUTE_PERCENT="30"), **LONG_KERNELS, **TEARDOWN}
    program = subprocess.Popen([str(plain.probe), "symbol", f"launch:{KERNELS}", f"wait:{go}"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        inside = first_measurement(work / "ctr" / "memory.region", program)
        go.touch()  # exit now, while the card still runs the program's kernels
        out, err = program.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        program.kill()
    assert_clean(err)
    assert program.returncode == 0, out + err
    assert inside.util_others_percent == 0, inside  # nobody else ran: the program's pid was matched
    last = read_region(work / "ctr" / "memory.region").devices[0]
    assert last.util_others_percent == 0 and last.util_container_percent > 0, last
