"""The interception library, the stand-in driver and the C test programs, built for one flavour
(plain or sanitized), and helpers that run the programs the way a container would."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpupool.shim.build import COMMON_FLAGS, Flavour, build_library, build_standin, find_compiler

PROGRAMS = Path(__file__).resolve().parent / "programs"
SOURCE_DIR = Path(__file__).resolve().parents[2] / "gpupool" / "shim" / "src"
#: Variables of the contract and of HAMi that must not leak from the test runner's environment.
CLEARED_PREFIXES = ("GPUPOOL_", "CUDA_DEVICE_", "LD_PRELOAD", "ASAN_", "UBSAN_")
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")
RUN_TIMEOUT_S = 60


@dataclass(frozen=True)
class Toolchain:
    """Everything one flavour's tests run: LD_PRELOAD value, driver directory, programs."""

    flavour: str
    preload: str
    standin: Path
    probe: Path
    launcher: Path
    lookup: Path  # looks entry points up and says what it was handed (programs/lookup.c)
    interposer: Path  # a library that wraps getppid through dlsym(RTLD_NEXT)
    granted_preload: str  # LD_PRELOAD of the library built to read the node's grant from grant_file
    grant_file: Path  # this flavour's stand-in for /etc/gpupool/grant; absent unless a test writes it

    def granted_env(self, work: Path, **variables: str) -> dict[str, str]:
        """The environment of a process in a gpupool container: the library that reads the grant."""
        return {**self.env(work, **variables), "LD_PRELOAD": self.granted_preload}

    def env(self, work: Path, **variables: str) -> dict[str, str]:
        """The environment of a process in the container whose directory is ``work/ctr``."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED_PREFIXES)}
        (work / "ctr").mkdir(exist_ok=True)
        base.update(
            LD_LIBRARY_PATH=str(self.standin),
            LD_PRELOAD=self.preload,
            GPUPOOL_STANDIN_STATE=str(work / "standin.state"),
            GPUPOOL_SHIM_DIR=str(work / "ctr"),
            ASAN_OPTIONS="abort_on_error=0:detect_leaks=1",
            UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
        )
        base.update(variables)
        return base


def build_toolchain(flavour: Flavour, out: Path) -> Toolchain:
    """Build (or find in the cache) the library and the stand-in driver, and compile the programs
    into ``out``, with one flavour's flags."""
    library = build_library(flavour=flavour, werror=True)  # digest-named in the cache: rebuilt on change
    grant_file = out / "node" / "grant"
    grant_file.parent.mkdir()
    granted = build_library(out / "libgpupool-shim-granted.so", flavour=flavour, werror=True,
                            grant_path=str(grant_file))
    standin = build_standin(flavour=flavour, werror=True)
    compiler = find_compiler()
    programs = {}
    for name in ("probe", "launcher", "lookup"):
        target = out / name
        flags = [f for f in (*COMMON_FLAGS, *flavour.flags) if f not in ("-shared", "-fPIC", "-fvisibility=hidden")]
        subprocess.run([*compiler, *flags, "-Werror", f"-I{SOURCE_DIR}", "-o", str(target), str(PROGRAMS / f"{name}.c"),
                        f"-L{standin}", "-l:libcuda.so.1", "-ldl", "-lpthread"], check=True, capture_output=True)
        programs[name] = target
    interposer = out / "libinterposer.so"
    subprocess.run([*compiler, *COMMON_FLAGS, *flavour.flags, "-Werror", "-o", str(interposer),
                    str(PROGRAMS / "interposer.c"), "-ldl"], check=True, capture_output=True)
    preload, granted_preload = str(library), str(granted)
    if "-fsanitize=address,undefined" in flavour.flags:
        # The sanitizer runtime must come first among the preloaded libraries.
        runtime = subprocess.run([*compiler, "-print-file-name=libasan.so"], capture_output=True, text=True,
                                 check=True).stdout.strip()
        preload, granted_preload = f"{runtime} {library}", f"{runtime} {granted}"
    return Toolchain(flavour.name, preload, standin, programs["probe"], programs["launcher"], programs["lookup"],
                     interposer, granted_preload, grant_file)


@dataclass(frozen=True)
class Step:
    """One line of the probe's output: the step, the CUresult, and what else it printed."""

    text: str
    code: int
    values: tuple[str, ...]


def parse_steps(stdout: str) -> list[Step]:
    """The probe's lines as steps."""
    steps = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].lstrip("-").isdigit():
            steps.append(Step(parts[0], int(parts[1]), tuple(parts[2:])))
    return steps


def assert_clean(stderr: str) -> None:
    """No sanitizer report in a program's error output."""
    found = [m for m in SANITIZER_MARKERS if m in stderr]
    assert not found, f"sanitizer report:\n{stderr[-4000:]}"


def run_probe(tc: Toolchain, env: Mapping[str, str], mode: str, *steps: str) -> tuple[list[Step], str]:
    """Run the probe to its end; returns its steps and its error output."""
    done = subprocess.run([str(tc.probe), mode, *steps], env=dict(env), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)
    assert_clean(done.stderr)
    assert done.returncode == 0, f"probe failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return parse_steps(done.stdout), done.stderr


def codes(steps: list[Step]) -> list[int]:
    """Just the CUresults, in order."""
    return [s.code for s in steps]


class Holder:
    """A probe left running (``hold`` as its last step), so its allocations stay live."""

    def __init__(self, tc: Toolchain, env: Mapping[str, str], *steps: str) -> None:
        self.process = subprocess.Popen([str(tc.probe), "symbol", *steps, "hold"], env=dict(env),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.steps: list[Step] = []

    def wait_ready(self) -> list[Step]:
        """Read lines until the ``hold`` step: every earlier step is done."""
        while not self.steps or self.steps[-1].text != "hold":
            self.read_step()
        return self.steps

    def read_step(self) -> Step:
        """Wait for the next step to finish."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"holder ended early: {self.process.wait()} {self.stderr()}")
        self.steps.extend(parse_steps(line))
        return self.steps[-1]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=RUN_TIMEOUT_S)

    def stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read() if self.process.poll() is not None else ""
