"""Refusal at open through the kernel's cgroup-device gate: how long from a decision to the refusal in
place, and what the gate adds to every open of a device.

    python3 bench/open_gate.py --json [--containers 50] [--opens 20000]

Needs root and a cgroup2 hierarchy (the node agent's own requirements for the gate). Fresh cgroup2
directories stand for containers; a stand-in card is a character device node (1:5, /dev/zero's
number) in a temporary directory.

- ``decision_to_refusal_first_ms``: ``ContainerGate.set`` for a container nothing was refused to yet
  (a program loaded and attached to its cgroup, then the map entry): from the decider's call to the
  kernel holding the refusal, p50 and max over ``--containers``.
- ``decision_to_refusal_ms``: the same for a second device of a container already gated (one map
  update), p50 and max.
- ``open_us_plain`` / ``open_us_gated``: one ``open()`` + ``close()`` of an allowed device by a
  process in a cgroup without the gate's program and with it (the program runs on every device
  open and finds nothing in its map), mean over ``--opens``.

The lending rules update the gate after every recorded open and every step (1 s); on kernels where
only the /proc scan sees opens, a holder's open is recorded within one scan interval (1 s), so that
interval, not the gate, bounds how soon an asker is refused after a holder opened.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.nodeagent.containers.container_gate import ContainerGate
from gpupool.nodeagent.linux.cgroup2 import cgroup2_mount, cgroup2_path_of_pid
from gpupool.nodeagent.linux.cgroup_device_gate import (
    CgroupDeviceGate,
    cgroup_device_gate_available,
)


def _open_us(path: str, count: int) -> float:
    began = time.perf_counter()
    for _ in range(count):
        os.close(os.open(path, os.O_RDONLY))
    return (time.perf_counter() - began) / count * 1e6


def _join(directory: str) -> None:
    with open(os.path.join(directory, "cgroup.procs"), "w", encoding="ascii") as fh:
        fh.write(str(os.getpid()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--containers", type=int, default=50)
    parser.add_argument("--opens", type=int, default=20000)
    args = parser.parse_args()
    available, why = cgroup_device_gate_available()
    mount = cgroup2_mount()
    if not available or mount is None:
        print(json.dumps({"error": f"cgroup-device gate unavailable: {why}"}))
        return 1
    home = os.path.join(mount, cgroup2_path_of_pid(os.getpid()).lstrip("/"))
    dirs = {f"{i:064x}": os.path.join(mount, f"gpupool-bench-{uuid.uuid4().hex[:10]}") for i in range(args.containers)}
    own = os.path.join(mount, f"gpupool-bench-self-{uuid.uuid4().hex[:10]}")
    with tempfile.TemporaryDirectory() as tmp:
        card, other = os.path.join(tmp, "nvidia0"), os.path.join(tmp, "nvidia1")
        os.mknod(card, 0o666 | 0o020000, os.makedev(1, 5))
        os.mknod(other, 0o666 | 0o020000, os.makedev(1, 3))
        for directory in (*dirs.values(), own):
            os.mkdir(directory)
        gate = ContainerGate(CgroupDeviceGate(), {**dirs, "self": own}.get)
        try:
            wanted: dict[str, list[str]] = {}
            for cid in dirs:
                wanted[cid] = [card]
                gate.set("bench", wanted)
            first = list(gate.stats.deny_seconds[-args.containers:])
            for cid in dirs:
                wanted[cid] = [card, other]
                gate.set("bench", wanted)
            update = list(gate.stats.deny_seconds[-args.containers:])
            _join(own)
            plain = _open_us(other, args.opens)
            gate.set("self", {"self": [card]})  # the program is attached; `other` stays allowed
            gated = _open_us(other, args.opens)
        finally:
            _join(home)
            gate.close()
            for directory in (*dirs.values(), own):
                os.rmdir(directory)
    result = {
        "bench": "open_gate", "kernel": os.uname().release, "containers": args.containers, "opens": args.opens,
        "decision_to_refusal_first_ms": {"p50": round(statistics.median(first) * 1e3, 3),
                                         "max": round(max(first) * 1e3, 3)},
        "decision_to_refusal_ms": {"p50": round(statistics.median(update) * 1e3, 3),
                                   "max": round(max(update) * 1e3, 3)},
        "open_us_plain": round(plain, 2), "open_us_gated": round(gated, 2),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
