"""Interception library: what it adds to an allocation and to a kernel launch.

    python3 bench/shim.py --json

Runs ``bench/shim_bench.c`` against the stand-in driver (kernels of zero length, so the card never
throttles anything) without the library and with it, ``--runs`` times each (taking turns), and
reports the difference of the medians per call:
- ``alloc_overhead_ns`` / ``free_overhead_ns``: cuMemAlloc_v2 / cuMemFree_v2 of 4 KiB under a
  memory limit (charge and release in the container's region, the pointer table);
- ``launch_overhead_ns``: cuLaunchKernel with no compute share (the library is active for memory);
- ``launch_overhead_ns_share``: cuLaunchKernel under a 50 % share that does not bind (the bucket
  path without waiting);
- ``lookup_overhead_ns``: cuGetProcAddress_v2 of wrapped base names at CUDA 12.8 (the answer swapped
  for the wrapper); ``lookup_overhead_ns_internal``: the same with the stand-in answering cuMemAlloc
  with an internal address (``GPUPOOL_STANDIN_PROC_INTERNAL=1``: found by name, the driver's newer
  ``cuMemAlloc_v3`` looked up once); ``lookup_past_overhead_ns_internal``: cuMemAlloc at CUDA 13.5
  then, where the library also asks the driver at 13.0 (the guard against newer variants).
Targets: <= 2,000 ns per allocation, <= 500 ns per launch. Prints a table and, with ``--json``,
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.shim.build import COMMON_FLAGS, SOURCE_DIR, build_library, build_standin, find_compiler

BENCH_SOURCE = Path(__file__).resolve().parent / "shim_bench.c"
ALLOCATIONS = 20_000
LAUNCHES = 200_000
LOOKUPS = 100_000
TARGET_ALLOC_NS = 2_000
TARGET_LAUNCH_NS = 500


def compile_bench(standin: Path, out: Path) -> Path:
    flags = [f for f in COMMON_FLAGS if f not in ("-shared", "-fPIC", "-fvisibility=hidden")]
    binary = out / "shim_bench"
    subprocess.run([*find_compiler(), *flags, "-O2", f"-I{SOURCE_DIR}", "-o", str(binary), str(BENCH_SOURCE),
                    f"-L{standin}", "-l:libcuda.so.1"], check=True)
    return binary


def run_once(binary: Path, env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run([str(binary), str(ALLOCATIONS), str(LAUNCHES), str(LOOKUPS)], env=env, capture_output=True,
                          text=True, check=True)
    parts = done.stdout.split()
    return {parts[i]: float(parts[i + 1]) for i in range(0, len(parts), 2)}


def medians(binary: Path, envs: list[dict[str, str]], runs: int) -> list[dict[str, float]]:
    """Median per configuration; the configurations take turns, so a load change hits them alike."""
    samples: list[list[dict[str, float]]] = [[] for _ in envs]
    for _ in range(runs):
        for index, env in enumerate(envs):
            samples[index].append(run_once(binary, env))
    return [{key: statistics.median(s[key] for s in runs_of) for key in runs_of[0]} for runs_of in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    parser.add_argument("--runs", type=int, default=7, help="runs per configuration (medians are reported)")
    args = parser.parse_args()
    library, standin = build_library(), build_standin()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        binary = compile_bench(standin, work)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "CUDA_DEVICE_", "LD_PRELOAD"))}
        base.update(LD_LIBRARY_PATH=str(standin), GPUPOOL_STANDIN_STATE=str(work / "standin.state"),
                    GPUPOOL_STANDIN_KERNEL_US="0")
        shimmed = {**base, "LD_PRELOAD": str(library), "GPUPOOL_SHIM_DIR": str(work),
                   "GPUPOOL_MEMORY_LIMIT_MIB": "16384"}
        internal = {"GPUPOOL_STANDIN_PROC_INTERNAL": "1"}
        without, with_memory, with_share, without_internal, with_internal = medians(
            binary, [base, shimmed, {**shimmed, "GPUPOOL_COMPUTE_PERCENT": "50"}, {**base, **internal},
                     {**shimmed, **internal}], args.runs)
    result = {
        "alloc_overhead_ns": round(with_memory["alloc_ns"] - without["alloc_ns"], 1),
        "free_overhead_ns": round(with_memory["free_ns"] - without["free_ns"], 1),
        "launch_overhead_ns": round(with_memory["launch_ns"] - without["launch_ns"], 1),
        "launch_overhead_ns_share": round(with_share["launch_ns"] - without["launch_ns"], 1),
        "lookup_overhead_ns": round(with_memory["lookup_ns"] - without["lookup_ns"], 1),
        "lookup_overhead_ns_internal": round(with_internal["lookup_ns"] - without_internal["lookup_ns"], 1),
        "lookup_past_overhead_ns_internal": round(with_internal["lookup_past_ns"]
                                                  - without_internal["lookup_past_ns"], 1),
        "lookup_ns_without": round(without["lookup_ns"], 1),
        "alloc_ns_without": round(without["alloc_ns"], 1),
        "launch_ns_without": round(without["launch_ns"], 1),
        "runs": args.runs,
    }
    print(f"{'':28}{'without':>10}{'with':>10}{'overhead':>10}{'target':>10}")
    print(f"{'cuMemAlloc_v2 (ns/call)':28}{without['alloc_ns']:>10.0f}{with_memory['alloc_ns']:>10.0f}"
          f"{result['alloc_overhead_ns']:>10.0f}{TARGET_ALLOC_NS:>10}")
    print(f"{'cuMemFree_v2 (ns/call)':28}{without['free_ns']:>10.0f}{with_memory['free_ns']:>10.0f}"
          f"{result['free_overhead_ns']:>10.0f}{'':>10}")
    print(f"{'cuLaunchKernel (ns/call)':28}{without['launch_ns']:>10.0f}{with_memory['launch_ns']:>10.0f}"
          f"{result['launch_overhead_ns']:>10.0f}{TARGET_LAUNCH_NS:>10}")
    print(f"{'  ... under a 50 % share':28}{without['launch_ns']:>10.0f}{with_share['launch_ns']:>10.0f}"
          f"{result['launch_overhead_ns_share']:>10.0f}{TARGET_LAUNCH_NS:>10}")
    print(f"{'cuGetProcAddress_v2 (ns)':28}{without['lookup_ns']:>10.0f}{with_memory['lookup_ns']:>10.0f}"
          f"{result['lookup_overhead_ns']:>10.0f}{'':>10}")
    print(f"{'  ... internal addresses':28}{without_internal['lookup_ns']:>10.0f}{with_internal['lookup_ns']:>10.0f}"
          f"{result['lookup_overhead_ns_internal']:>10.0f}{'':>10}")
    print(f"{'  ... cuMemAlloc at 13.5':28}{without_internal['lookup_past_ns']:>10.0f}"
          f"{with_internal['lookup_past_ns']:>10.0f}{result['lookup_past_overhead_ns_internal']:>10.0f}{'':>10}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
