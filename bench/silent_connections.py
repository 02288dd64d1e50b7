"""Silent connections against gpupool's servers: memory held by the extender's TLS port and the delay
they add to a registration on the node agent's registration socket (issue 28, docs/security.md).

    python3 bench/silent_connections.py --json [--silent 10000] [--baseline 1000] [--idle 1000] [--rounds 5]

RSS: a child process serves an aiohttp application on a TLS port (a fresh CA and serving certificate,
client certificates required) the way ``gpupool extender`` does (``extender/http/serving.py``:
``BoundedSite`` under the default ``ServerLimits``); the bench opens ``--silent`` TCP connections
that never send a byte, waits one second, and reads the child's VmRSS (``/proc``) before and after.
``--baseline`` connections are held against a plain ``aiohttp.web.TCPSite`` with the same TLS
context (what the extender served before) for the per-connection figure without a cap.

Registration: ``--idle`` unix connections held open without a byte, then one valid registration
from this process, timed from connect to reply; ``--rounds`` times, the median reported.
One JSON line with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import socket
import ssl
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from the root as a file

from aiohttp import web

from gpupool.api.shim_contract import RegisterRequest, decode_reply, encode_request
from gpupool.extender.http.certificates import issue_ca, issue_leaf
from gpupool.netguard.limits import ServerLimits
from gpupool.netguard.site import BoundedSite, bounded_runner
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry
from gpupool.nodeagent.isolation.shim_socket import RegistrationServer
from gpupool.nodeagent.monitor.container_resolver import ContainerResolver

LOOPBACK = "127.0.0.1"
TOKEN = "ab" * 32


def tls_context(directory: Path) -> ssl.SSLContext:
    ca = issue_ca("bench-ca")
    leaf = issue_leaf(ca, "extender", server=True, hosts=(LOOPBACK,))
    for name, data in (("tls.crt", leaf.cert_pem), ("tls.key", leaf.key_pem), ("ca.crt", ca.cert_pem)):
        (directory / name).write_bytes(data)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(directory / "tls.crt"), str(directory / "tls.key"))
    context.load_verify_locations(str(directory / "ca.crt"))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def serve(port: int, bounded: bool, ready: Any) -> None:
    """The child: one TLS port until killed (``ready``: a multiprocessing Event set once it listens)."""
    async def main() -> None:
        app = web.Application()
        app.router.add_get("/healthz", healthz)
        with tempfile.TemporaryDirectory() as tmp:
            context = tls_context(Path(tmp))
            limits = ServerLimits()
            runner = bounded_runner(app, limits, access_log=None) if bounded else web.AppRunner(app, access_log=None)
            await runner.setup()
            site: web.BaseSite = (BoundedSite(runner, LOOPBACK, port, limits, context) if bounded
                                  else web.TCPSite(runner, LOOPBACK, port, ssl_context=context))
            await site.start()
            ready.set()
            await asyncio.Event().wait()
    asyncio.run(main())


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def rss_growth(n: int, bounded: bool) -> tuple[float, float]:
    """(RSS before, RSS with ``n`` silent connections held), MB."""
    port, ready = free_port(), multiprocessing.Event()
    child = multiprocessing.Process(target=serve, args=(port, bounded, ready), daemon=True)
    child.start()
    try:
        ready.wait(30)
        time.sleep(0.5)
        assert child.pid is not None
        before = rss_mb(child.pid)
        with ExitStack() as stack:
            for _ in range(n):
                sock = stack.enter_context(socket.socket())
                sock.settimeout(10)
                sock.connect((LOOPBACK, port))
            time.sleep(1.0)
            after = rss_mb(child.pid)
        return before, after
    finally:
        child.kill()
        child.join(10)


def registration_latency(idle: int, rounds: int) -> list[float]:
    async def main() -> list[float]:
        directory = InMemoryContainerDirectory()
        registry = ShimRegistry(ContainerResolver(directory).cgroup_identity, directory)
        registry.issue(TOKEN, "uid", "main", "ns", "p")
        line = encode_request(RegisterRequest(TOKEN, os.getpid(), "ns/p", "main"))
        with tempfile.TemporaryDirectory(prefix="gs", dir="/tmp") as base:
            server = RegistrationServer(os.path.join(base, "agent.sock"), registry)
            await server.start()
            try:
                took = []
                for _ in range(rounds):
                    took.append(await asyncio.to_thread(one_round, server.path, idle, line))
                return took
            finally:
                await server.stop()
    return asyncio.run(main())


def one_round(path: str, idle: int, line: bytes) -> float:
    with ExitStack() as stack:
        for _ in range(idle):
            sock = stack.enter_context(socket.socket(socket.AF_UNIX))
            sock.connect(path)
        time.sleep(0.3)
        started = time.monotonic()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(60)
            sock.connect(path)
            sock.sendall(line)
            reply = decode_reply(sock.makefile("rb").readline())
        took = time.monotonic() - started
        if not reply.ok:
            raise RuntimeError(f"registration refused: {reply.reason}")
        return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--silent", type=int, default=10_000)
    parser.add_argument("--baseline", type=int, default=1_000)
    parser.add_argument("--idle", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * args.silent + 1024)), hard))
    before, after = rss_growth(args.silent, bounded=True)
    base_before, base_after = rss_growth(args.baseline, bounded=False) if args.baseline else (0.0, 0.0)
    latency = registration_latency(args.idle, args.rounds)
    result = {
        "silent_connections": args.silent, "rss_before_mb": round(before, 1), "rss_after_mb": round(after, 1),
        "rss_growth_mb": round(after - before, 1), "cap": ServerLimits().max_connections,
        "baseline_connections": args.baseline,
        "baseline_kb_per_connection": round((base_after - base_before) * 1024 / args.baseline, 1)
        if args.baseline else None,
        "idle_registration_connections": args.idle, "registration_rounds": args.rounds,
        "registration_median_ms": round(statistics.median(latency) * 1000, 1),
        "registration_max_ms": round(max(latency) * 1000, 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
