"""Usage monitor: latency from a device open to its record in the state file, and steady-state CPU.

    python3 bench/monitor.py --json

- ``open_to_state_p99_ms``: 8 child processes open and close stand-in device files (regular files:
  fanotify reports no character-device opens on some kernels) 1,000 times in all; each open's
  ``time.monotonic()`` taken in the child just before ``open()`` is matched with the end of the
  state-file write (rename included) that first shows that process holding that file. Writes go
  through the write-behind writer to a state file on tmpfs (``/dev/shm``, standing in for the
  default ``/run/gpupool``; no fsync there), as in the agent; ``*_fsync`` the same on this disk
  with fsyncs (a state file configured under ``/var/lib``); ``state_write_*`` one fsync'ed write
  alone (this disk's floor). Needs root (fanotify permission events); the source is the fanotify
  one, the decider allows all.
- ``agent_cpu_pct``: CPU of this process (all threads) as a percentage of one core while the
  monitor runs with 8 cards x 64 holding processes at 1 s sampling: scripted usage samples, the idle
  rule, and a prune every ``--prune-every`` seconds; ``agent_cpu_pct_scan`` the same with the /proc
  scan source (1 s) instead of fanotify, once the processes are past the scan's start-up window
  (``YOUNG_SCANS`` scans, every fd table listed each scan), and ``agent_cpu_pct_scan_startup`` during
  that window (the first seconds after 512 processes started at once).
Prints a table and, with ``--json``, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.nodeagent.linux.fs_kind import in_memory
from gpupool.nodeagent.linux.watched_files import WatchedFiles
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind, EventSource, Registration
from gpupool.nodeagent.monitor.fanotify_source import FanotifySource
from gpupool.nodeagent.monitor.idle import IdleDetector
from gpupool.nodeagent.monitor.proc_scan_source import YOUNG_SCANS, ProcScanSource
from gpupool.nodeagent.monitor.process_table import ProcfsTable
from gpupool.nodeagent.monitor.recorder import UsageRecorder
from gpupool.nodeagent.monitor.scripted_usage import ScriptedUsage
from gpupool.nodeagent.monitor.source_selector import probe_fanotify
from gpupool.nodeagent.monitor.state_file import StateFile
from gpupool.nodeagent.monitor.state_writer import BackgroundStateWriter
from gpupool.nodeagent.monitor.usage_state import DeviceUsage, UsageState

CARDS = 8
OPENER = """
import json, os, sys, time
paths, count = sys.argv[1:-1], int(sys.argv[-1])
opened = []
for k in range(count):
    path = paths[k % len(paths)]
    opened.append((path, time.monotonic()))
    fd = os.open(path, os.O_RDONLY)
    time.sleep(0.002)
    os.close(fd)
    time.sleep(0.01)
print(json.dumps(opened))
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class EventCounter:
    """Numbers the events the recorder applies, and notes which number each state-file write
    includes: an open followed by its close within one write never shows as a holder, yet the write
    after it is the one that recorded it."""

    def __init__(self) -> None:
        self.applied = 0
        self.opens: dict[tuple[str, int], list[int]] = {}
        self.writes: list[tuple[int, float]] = []  # (events included, monotonic time written)
        self._included: dict[int, int] = {}

    def count(self, event: DeviceEvent) -> None:
        self.applied += 1
        if event.kind is EventKind.OPEN:
            self.opens.setdefault((event.path, event.pid), []).append(self.applied)

    def queued(self, state: UsageState) -> None:
        self._included[id(state)] = self.applied

    def written(self, state: UsageState) -> None:
        self.writes.append((self._included[id(state)], time.monotonic()))


class CountingWriter(BackgroundStateWriter):
    def __init__(self, file: StateFile, counter: EventCounter) -> None:
        super().__init__(file)
        self.counter = counter
        self.states: list[UsageState] = []

    def write(self, state: UsageState) -> None:
        self.states.append(state)  # keeps id(state) unique
        self.counter.queued(state)
        super().write(state)


class CountedStateFile(StateFile):
    def __init__(self, path: Path, counter: EventCounter, sync: bool | None) -> None:
        super().__init__(path, sync=sync)
        self.counter = counter

    def write(self, state: UsageState) -> None:
        super().write(state)
        self.counter.written(state)


def open_latency(directory: Path, opens: int, processes: int, state_dir: Path, sync: bool | None,
                 suffix: str) -> dict[str, float]:
    """``sync`` None: as the agent (fsync unless ``state_dir`` is on tmpfs)."""
    devices = [str(directory / f"nvidia{i}") for i in range(CARDS)]
    for path in devices:
        Path(path).write_text("stand-in\n")
    counter = EventCounter()
    writer = CountingWriter(CountedStateFile(state_dir / "state.json", counter, sync), counter)
    writer.start()
    recorder = UsageRecorder("bench", devices, writer, ProcfsTable(WatchedFiles(devices)))
    recorder.restore()

    def sink(event: DeviceEvent) -> None:
        counter.count(event)
        recorder.on_event(event)

    source = FanotifySource(devices)
    source.register(Registration(sink, recorder.registration().decide))
    source.start()
    try:
        children = [subprocess.Popen([sys.executable, "-c", OPENER, *devices[i:], *devices[:i],
                                      str(opens // processes)], stdout=subprocess.PIPE, text=True)
                    for i in range(processes)]
        results = [(child.pid, json.loads(child.communicate()[0])) for child in children]
        time.sleep(0.2)
    finally:
        source.stop()
        writer.stop()
    latencies: list[float] = []
    unmatched = 0
    for pid, opened in results:
        per_key: dict[tuple[str, int], list[float]] = {}
        for path, at in opened:
            per_key.setdefault((path, pid), []).append(at)
        for key, times in per_key.items():
            numbers = counter.opens.get(key, [])
            unmatched += abs(len(times) - len(numbers))
            for at, number in zip(times, numbers, strict=False):
                done = next(w for included, w in counter.writes if included >= number)
                latencies.append((done - at) * 1000)
    return {f"opens{suffix}": float(sum(len(o) for _, o in results)), f"unmatched_opens{suffix}": float(unmatched),
            f"state_writes{suffix}": float(len(counter.writes)),
            f"open_to_state_p50_ms{suffix}": percentile(latencies, 0.5),
            f"open_to_state_p99_ms{suffix}": percentile(latencies, 0.99),
            f"open_to_state_max_ms{suffix}": max(latencies)}


def write_latency(directory: Path, writes: int) -> dict[str, float]:
    """What one fsync'ed state-file write costs on this disk (the floor of the latency above)."""
    file = StateFile(directory / "alone.json", sync=True)
    state = UsageState("bench", 0.0, tuple(DeviceUsage(f"/dev/nvidia{i}") for i in range(CARDS)))
    took = []
    for _ in range(writes):
        start = time.perf_counter()
        file.write(state)
        took.append((time.perf_counter() - start) * 1000)
    return {"state_write_p50_ms": percentile(took, 0.5), "state_write_p99_ms": percentile(took, 0.99)}


def steady_cpu(directory: Path, per_card: int, seconds: float, prune_every: float, scan: bool) -> tuple[float, float]:
    """CPU percent of one core: during the scan's start-up window (0 for fanotify), and after it."""
    devices = [str(directory / f"gpu{i}") for i in range(CARDS)]
    for path in devices:
        Path(path).write_text("stand-in\n")
    holders = [subprocess.Popen(["sh", "-c", 'exec 3<"$1"; exec sleep 3600', "sh", path])
               for path in devices for _ in range(per_card)]
    try:
        time.sleep(0.5)
        pids = [h.pid for h in holders]
        usage = {"cards": [{"memoryMiB": 81920}] * CARDS, "usage": [
            {"at": 0, "card": c, "utilization": 30,
             "processes": [{"pid": p, "memoryMiB": 100, "sm": 1} for p in pids[c * per_card:(c + 1) * per_card]]}
            for c in range(CARDS)]}
        sampler = ScriptedUsage.from_dict(usage, time.time)
        recorder = UsageRecorder("bench", devices, StateFile(directory / "steady.json"),
                                 ProcfsTable(WatchedFiles(devices)))
        recorder.restore()
        source: EventSource = ProcScanSource(devices, interval=1.0) if scan else FanotifySource(devices)
        source.register(recorder.registration())
        detector = IdleDetector({p: i for i, p in enumerate(devices)})
        stop = threading.Event()

        def sampling() -> None:
            last_prune = time.monotonic()
            while not stop.wait(1.0):
                for path, state in detector.observe(recorder.state, sampler.sample()).items():
                    recorder.set_state(path, state)
                if time.monotonic() - last_prune >= prune_every:
                    recorder.prune()
                    last_prune = time.monotonic()

        source.start()
        begun = time.monotonic()
        thread = threading.Thread(target=sampling, daemon=True)
        thread.start()
        time.sleep(1.5)  # past the scan source's first full scan
        startup = 0.0
        if scan:
            startup = measure_cpu(min(seconds, YOUNG_SCANS - 2.0))
            time.sleep(max(0.0, YOUNG_SCANS + 2.0 - (time.monotonic() - begun)))
        steady = measure_cpu(seconds)
        stop.set()
        thread.join()
        source.stop()
        assert sum(len(d.holders) for d in recorder.state.devices) == len(holders)
        return startup, steady
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


def measure_cpu(seconds: float) -> float:
    """CPU of this process over the next ``seconds``, in percent of one core."""
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    return 100 * (time.process_time() - cpu0) / (time.monotonic() - wall0)


def memory_directory() -> str | None:
    """A tmpfs directory for the state file, standing in for /run/gpupool (None: none here)."""
    return next((d for d in ("/run", "/dev/shm") if in_memory(d)), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--opens", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--per-card", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--prune-every", type=float, default=30.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        why_not = probe_fanotify([__file__])
        if why_not is not None:
            sys.exit(f"fanotify not usable here: {why_not}")
        memory = memory_directory()
        if memory is None:
            sys.exit("no tmpfs directory (/run or /dev/shm) for the state file")
        with tempfile.TemporaryDirectory(dir=memory) as state_dir:
            result = open_latency(Path(directory), args.opens, args.processes, Path(state_dir), None, "")
        result.update(open_latency(Path(directory), args.opens, args.processes, Path(directory), True, "_fsync"))
        result.update(write_latency(Path(directory), 300))
        _, result["agent_cpu_pct"] = steady_cpu(Path(directory), args.per_card, args.seconds, args.prune_every,
                                                False)
        result["agent_cpu_pct_scan_startup"], result["agent_cpu_pct_scan"] = steady_cpu(
            Path(directory), args.per_card, args.seconds, args.prune_every, True)
    print(f"{'metric':<30} {'value':>10}")
    for key, value in result.items():
        print(f"{key:<30} {value:>10.2f}")
    if args.json:
        print(json.dumps({k: round(v, 3) for k, v in result.items()}))


if __name__ == "__main__":
    main()
