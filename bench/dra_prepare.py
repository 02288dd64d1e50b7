"""DRA prepare/unprepare latency with N claims at once on one node (real gRPC, fake kubelet side).

    python3 bench/dra_prepare.py --claims 100 --json

The node agent's DRA plugin serves on a temporary socket, in a process of its own as beside a
real kubelet, with an in-memory claim store (``--api-ms``: each read waits that long, an API
round trip), and writes real CDI specs and its checkpoint to temporary directories. Like kubelet,
the caller keeps one connection and sends one NodePrepareResources per pod (one claim each), all
at once, then one NodeUnprepareResources per claim, all at once, after a warm-up round of 10 other
claims (a plugin that has served before: no first-call imports or thread start-up in the figures).
The latency is measured around each RPC (what kubelet waits for, queueing behind the plugin's lock
included). Prints a table and, with ``--json``, one line ``{"client": ..., "prepare_p99_ms": ...,
"unprepare_p99_ms": ...}``.

The caller is a Go gRPC client by default, as kubelet is (``bench/dra_prepare_client``, built once
and cached: :mod:`bench.dra_prepare_go`); a Python ``grpc.aio`` client on the same small machine
spends CPU the plugin then waits for. ``--client python`` takes that one; where Go cannot build the
client, ``auto`` (the default) takes it too and says why on stderr.

The CDI specs go to a directory in ``/dev/shm``, as on a node, whose ``/var/run/cdi`` is on tmpfs
(``/run``); ``--cdi-on-disk`` puts them in the temporary directory on this machine's disk instead,
where one spec's write-and-rename costs about half a millisecond of kernel time. The checkpoint is
on disk in both (kubelet's directory is).

``--floor``: the plugin answers every call at once, preparing nothing (its claim state's prepare
and unprepare replaced in its process): what the gRPC calls and the two processes alone cost on
this machine, the least the figures above can be.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import dra_prepare_go
from gpupool.core.model import GpuCard, Topology
from gpupool.nodeagent.dra.api import dra_grpc, dra_pb
from gpupool.nodeagent.dra.claim_allocation import ClaimRef
from gpupool.nodeagent.dra.claim_state import PreparedDevice
from gpupool.nodeagent.dra.setup import DraDriver, DraOptions
from gpupool.nodeagent.gpu_inventory import GpuInventory

NODE = "bench-node"
WARMUP = 10
DRIVER = "gpu.gpupool.io"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def claim(i: int, cards: int) -> dict[str, Any]:
    """Claim ``i``: 512 MiB and 1 % of card ``i mod cards`` (100 claims fit on 8 x 80 GB cards)."""
    return {"metadata": {"name": f"c{i}", "namespace": "bench", "uid": f"uid-{i}"},
            "status": {"allocation": {"devices": {"results": [{
                "request": "gpu", "driver": DRIVER, "pool": NODE, "device": f"gpu-{i % cards}",
                "consumedCapacity": {"memory": "512Mi", "compute": "1"}, "shareID": f"s{i}"}]}},
                "reservedFor": [{"resource": "pods", "name": f"p{i}", "uid": f"pod-{i}"}]}}


async def timed(call: Any, request: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    reply = await call(request, timeout=30)
    return (time.perf_counter() - start) * 1000.0, reply


def serve(directory: str, claims: int, cards: int, api_ms: float, floor: bool = False,
          cdi_dir: str | None = None) -> None:
    """The plugin's process: serve until terminated."""
    asyncio.run(_serve(directory, claims, cards, api_ms, floor, cdi_dir or f"{directory}/cdi"))


async def _serve(directory: str, claims: int, cards: int, api_ms: float, floor: bool, cdi_dir: str) -> None:
    objects = {("bench", f"c{i}"): claim(i, cards) for i in range(claims + WARMUP)}

    async def read(namespace: str, name: str) -> Mapping[str, Any] | None:
        if api_ms:
            await asyncio.sleep(api_ms / 1000.0)
        return objects.get((namespace, name))

    inventory = GpuInventory(tuple(GpuCard(i, f"GPU-{i}", "NVIDIA-H100", 81920) for i in range(cards)), Topology(),
                             tuple(f"/dev/nvidia{i}" for i in range(cards)))

    class NoSlices:
        async def read_slice(self, name: str) -> None:
            return None

        async def write_slice(self, body: Mapping[str, Any], version: str | None) -> None:
            return None

    driver = DraDriver(NODE, "gpupool.io", DraOptions(f"{directory}/kubelet", cdi_dir),
                       lambda: inventory, read, NoSlices())
    if floor:
        async def prepared(refs: Sequence[ClaimRef]) -> dict[str, list[PreparedDevice] | str]:
            return {ref.uid: [] for ref in refs}

        async def unprepared(refs: Sequence[ClaimRef]) -> dict[str, str]:
            return {ref.uid: "" for ref in refs}

        driver.state.prepare = prepared  # type: ignore[method-assign]
        driver.state.unprepare = unprepared  # type: ignore[method-assign]
    await driver.server.start()
    await asyncio.Event().wait()


async def run(claims: int, cards: int, api_ms: float = 0.0, floor: bool = False,
              cdi_tmpfs: bool = False, client: str = "python") -> dict[str, float]:
    """Serve the plugin in a process of its own and drive it with ``client`` ("go" or "python")."""
    with tempfile.TemporaryDirectory(prefix="dra-bench-", dir="/tmp") as d, \
            tempfile.TemporaryDirectory(prefix="dra-bench-cdi-", dir="/dev/shm" if cdi_tmpfs else d) as cdi:
        socket = DraOptions(f"{d}/kubelet").socket_path(DRIVER)
        server = multiprocessing.get_context("spawn").Process(target=serve,
                                                              args=(d, claims, cards, api_ms, floor, cdi),
                                                              daemon=True)
        server.start()
        try:
            while not os.path.exists(socket):
                await asyncio.sleep(0.05)
            if client == "go":
                rounds = await asyncio.to_thread(dra_prepare_go.run_client, socket, claims, WARMUP)
            else:
                rounds = await python_client(socket, claims)
        finally:
            server.terminate()
            server.join()
    prep, unprep = rounds.prepare_ms, rounds.unprepare_ms
    return {"claims": claims, "api_ms": api_ms, "prepare_p50_ms": statistics.median(prep),
            "prepare_p99_ms": percentile(prep, 0.99),
            "prepare_wall_s": rounds.prepare_wall_s, "unprepare_p50_ms": statistics.median(unprep),
            "unprepare_p99_ms": percentile(unprep, 0.99), "unprepare_wall_s": rounds.unprepare_wall_s}


async def python_client(socket: str, claims: int) -> dra_prepare_go.GoRounds:
    """The rounds the Go client makes, made by a ``grpc.aio`` client in this process."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_grpc.DRAPluginStub(channel)
        await channel.channel_ready()
        warm = [dra_pb.Claim(namespace="bench", name=f"c{i}", uid=f"uid-{i}")
                for i in range(claims, claims + WARMUP)]
        await asyncio.gather(*(stub.NodePrepareResources(dra_pb.NodePrepareResourcesRequest(claims=[r]))
                               for r in warm))
        await asyncio.gather(*(stub.NodeUnprepareResources(dra_pb.NodeUnprepareResourcesRequest(claims=[r]))
                               for r in warm))
        refs = [dra_pb.Claim(namespace="bench", name=f"c{i}", uid=f"uid-{i}") for i in range(claims)]
        start = time.perf_counter()
        prepared = await asyncio.gather(*(timed(stub.NodePrepareResources,
                                                dra_pb.NodePrepareResourcesRequest(claims=[r])) for r in refs))
        prepare_wall = time.perf_counter() - start
        errors = [e for _, reply in prepared for a in reply.claims.values() if (e := a.error)]
        if errors:
            raise SystemExit(f"prepare failed: {errors[0]}")
        start = time.perf_counter()
        unprepared = await asyncio.gather(*(timed(stub.NodeUnprepareResources,
                                                  dra_pb.NodeUnprepareResourcesRequest(claims=[r]))
                                            for r in refs))
        unprepare_wall = time.perf_counter() - start
    return dra_prepare_go.GoRounds([ms for ms, _ in prepared], [ms for ms, _ in unprepared],
                                   prepare_wall, unprepare_wall)


def chosen_client(asked: str) -> str:
    """The client to run: ``asked``, or for "auto" the Go one where it can be built, else Python
    (saying why on stderr)."""
    if asked != "auto":
        return asked
    reason = dra_prepare_go.unavailable()
    if reason is None:
        return "go"
    print(f"dra_prepare: the Go client cannot be used ({reason}); measuring with the Python client, "
          f"whose own CPU the figures then include", file=sys.stderr)
    return "python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--api-ms", type=float, default=0.0, help="latency of each claim read")
    parser.add_argument("--floor", action="store_true", help="the plugin answers at once, preparing nothing")
    parser.add_argument("--cdi-on-disk", action="store_true",
                        help="write the CDI specs to this machine's disk, not to /dev/shm (tmpfs, as on a node)")
    parser.add_argument("--cdi-tmpfs", action="store_true", help="the default (kept for older commands)")
    parser.add_argument("--client", choices=("auto", "go", "python"), default="auto",
                        help="kubelet's side: the Go client (auto: when Go can build it) or a Python grpc.aio one")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    client = chosen_client(args.client)
    result = asyncio.run(run(args.claims, args.cards, args.api_ms, args.floor, not args.cdi_on_disk, client))
    print(f"{'client':<24} {client:>10}")
    for key, value in result.items():
        print(f"{key:<24} {value:>10.2f}")
    if args.json:
        print(json.dumps({"client": client, **{k: round(v, 3) for k, v in result.items()}}))


if __name__ == "__main__":
    main()
