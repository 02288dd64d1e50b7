"""An owner's first allocation during a reclaim of its lent card (seed 000, case A).

    python3 bench/owner_wait.py --json [--runs 3]

The interception library over the stand-in driver, one 16 GiB card whose memory every process
shares (``GPUPOOL_STANDIN_SHARED_MEMORY=1``). The owner's container (12 GiB share) holds 2 GiB; the
card is lent, so the agent's wait bound is in the owner's region (15 s, what
``--checkpoint-deadline 10`` gives); the borrower's container holds 12 GiB. The owner comes back:
the borrower is frozen (as the agent does) and a new owner process allocates its remaining 10 GiB
while only 2 GiB are free; the borrower is killed ``drain`` seconds later (its reclaim ending) and
the driver gives its memory back.

- ``owner_first_alloc_ms``: per drain time, the owner's ``cuMemAlloc_v2`` as the owner process
  timed it (it succeeds once the borrower's memory is back);
- ``after_drain_ms_max``: the most any allocation took beyond its drain time (the library polls
  every 5 ms; the owner process starts a little after the clock, so this errs low by its start-up);
- ``without_wait``: the same allocation with no loan (no wait bound): the driver's out-of-memory,
  returned at once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.shim.build import COMMON_FLAGS, SOURCE_DIR, build_library, build_standin, find_compiler
from gpupool.shim.region import freeze_memory, set_wait

SOURCE = Path(__file__).resolve().parent / "owner_wait.c"
DRAINS_S = (0.1, 0.5, 2.0)
WAIT_S = 15.0


def compile_program(standin: Path, out: Path) -> Path:
    flags = [f for f in COMMON_FLAGS if f not in ("-shared", "-fPIC", "-fvisibility=hidden")]
    binary = out / "owner_wait"
    subprocess.run([*find_compiler(), *flags, "-O2", f"-I{SOURCE_DIR}", "-o", str(binary), str(SOURCE),
                    f"-L{standin}", "-l:libcuda.so.1"], check=True)
    return binary


class Container:
    """The environment of one container's processes (its own region directory)."""

    def __init__(self, base: dict[str, str], work: Path, name: str, limit_mib: int) -> None:
        self.directory = work / name
        self.directory.mkdir()
        self.env = {**base, "GPUPOOL_SHIM_DIR": str(self.directory), "GPUPOOL_MEMORY_LIMIT_MIB": str(limit_mib)}

    @property
    def region(self) -> Path:
        return self.directory / "memory.region"

    def hold(self, binary: Path, mib: int) -> subprocess.Popen[str]:
        process = subprocess.Popen([str(binary), str(mib), "hold"], env=self.env, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        rc = process.stdout.readline().split()[0]
        if rc != "0":
            raise RuntimeError(f"holding {mib} MiB failed: CUresult {rc}")
        return process

    def allocate(self, binary: Path, mib: int) -> tuple[int, float]:
        done = subprocess.run([str(binary), str(mib)], env=self.env, capture_output=True, text=True, check=True,
                              timeout=WAIT_S + 10)
        rc, ns = done.stdout.split()
        return int(rc), float(ns) / 1e6


def one_reclaim(binary: Path, base: dict[str, str], drain_s: float | None) -> tuple[int, float]:
    """The owner's 10 GiB allocation beside a 12 GiB borrower; ``None``: no loan, nothing drains."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {**base, "GPUPOOL_STANDIN_STATE": str(work / "standin.state")}
        owner, borrower = Container(env, work, "owner", 12288), Container(env, work, "borrower", 14336)
        idle = owner.hold(binary, 2048)
        lent = borrower.hold(binary, 12288)
        try:
            if drain_s is None:
                return owner.allocate(binary, 10240)
            set_wait(owner.region, 0, int(WAIT_S * 1e9))  # the card is lent
            freeze_memory(borrower.region, 0)  # the owner is back
            killer = threading.Timer(drain_s, lambda: (lent.kill(), lent.wait()))  # reaped: the driver frees
            killer.start()
            result = owner.allocate(binary, 10240)
            killer.join()
            return result
        finally:
            for process in (idle, lent):
                process.kill()
                process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--runs", type=int, default=3, help="reclaims per drain time")
    args = parser.parse_args()
    library, standin = build_library(), build_standin()
    with tempfile.TemporaryDirectory() as tmp:
        binary = compile_program(standin, Path(tmp))
        base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "CUDA_DEVICE_", "LD_PRELOAD"))}
        base.update(LD_LIBRARY_PATH=str(standin), LD_PRELOAD=str(library), GPUPOOL_STANDIN_SHARED_MEMORY="1")
        samples: dict[str, list[float]] = {}
        beyond: list[float] = []
        for drain in DRAINS_S:
            for _ in range(args.runs):
                rc, ms = one_reclaim(binary, base, drain)
                if rc != 0:
                    print(json.dumps({"error": f"the owner's allocation failed (CUresult {rc}) with a "
                                               f"{drain} s drain"}))
                    return 1
                samples.setdefault(f"drain_{drain:g}s", []).append(round(ms, 1))
                beyond.append(ms - drain * 1000)
        rc, ms = one_reclaim(binary, base, None)
    result = {"bench": "owner_wait", "owner_first_alloc_ms": samples,
              "after_drain_ms_max": round(max(beyond), 1), "wait_bound_s": WAIT_S,
              "without_wait": {"cuda_result": rc, "ms": round(ms, 2)}}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
