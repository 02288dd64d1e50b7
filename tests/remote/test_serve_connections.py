"""``gpupool remote-gpu serve --status FILE``: the clients connected now, per pod and card, from the
C server's per-connection processes; a client that ends or is killed leaves it, a refused one never
enters it, and no token is written (docs/remote-gpu.md, "The GPU node's agent")."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.api.remote_connections import CONNECTIONS_FILE, ClientConnections, decode_connections
from gpupool.core.model import GpuCard, Topology
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.remote_usage import remote_client_rows
from gpupool.remotegpu.serve import ConnectionsReport, live_connections
from tests.remote.remote_support import (
    Programs,
    build_programs,
    client,
    probe_env,
    run_probe,
    running_server,
    token,
    wait_line,
)

INVENTORY = GpuInventory((GpuCard(0, "GPU-standin-0", "standin", 16384),), Topology.flat(1), ("/dev/nvidia0",))


def connections(path: Path) -> tuple[ClientConnections, ...]:
    return decode_connections(path.read_text()) if path.exists() else ()


def wait_for(check: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_stale_files_of_dead_or_foreign_processes_are_dropped(tmp_path: Path) -> None:
    """Only files of live children of the server count; others (killed, pid reused) are removed."""
    directory = tmp_path / "connections"
    directory.mkdir()
    child = subprocess.Popen(["sleep", "30"])
    try:
        (directory / str(child.pid)).write_text("ns/pod-a\tGPU-0\n")
        (directory / str(os.getpid())).write_text("ns/pod-b\tGPU-0\n")  # alive, not the server's child
        (directory / ".123").write_text("ns/pod-c\tGPU-0\n")  # being written
        assert live_connections(directory, os.getpid()) == {("ns/pod-a", "GPU-0"): 1}
        assert not (directory / str(os.getpid())).exists()
        report = ConnectionsReport(directory, tmp_path / "status.json")
        assert report.refresh(os.getpid()) and not report.refresh(os.getpid())
        assert connections(report.status) == (ClientConnections("ns/pod-a", "GPU-0", 1),)
    finally:
        child.kill()
        child.wait()
    assert report.refresh(os.getpid()) and connections(report.status) == ()
    assert not (directory / str(child.pid)).exists()


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return build_programs(tmp_path_factory.mktemp("remote-programs"))


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--enforce-compute"]], ids=["direct", "executor"])
def test_connected_clients_are_reported_while_connected(programs: Programs, tmp_path: Path,
                                                        extra: list[str]) -> None:
    status = tmp_path / CONNECTIONS_FILE  # beside the clients file: where the node agent reads it
    with running_server(programs, tmp_path, [client("a"), client("b")], extra=extra) as server:
        endpoint = f"127.0.0.1:{server.port}"
        assert wait_for(lambda: status.exists() and connections(status) == ())
        waiters = [subprocess.Popen([str(programs.probe), "wait_loop"], stdout=subprocess.PIPE, text=True,
                                    env=probe_env(programs, endpoint, token("a"))) for _ in range(2)]
        try:
            assert all(wait_line(w, 30) == "waiting" for w in waiters)
            expected = (ClientConnections("ns/pod-a", "GPU-standin-0", 2),)
            assert wait_for(lambda: connections(status) == expected), connections(status)
            refused = run_probe(programs, probe_env(programs, endpoint, "x" * 43), "vector_add", "10")
            assert refused.startswith("error")
            assert connections(status) == expected
            # the node agent's reader finds the server's report beside the clients file it wrote
            rows = remote_client_rows(server.clients_file, INVENTORY)
            assert [(r.pod, r.card, r.connections) for r in rows] == [("pod-a", 0, 2), ("pod-b", 0, 0)]
            text = status.read_text()
            assert token("a") not in text and token("b") not in text
            waiters[0].kill()  # killed: its server process ends with the connection
            waiters[0].wait()
            one = (ClientConnections("ns/pod-a", "GPU-standin-0", 1),)
            assert wait_for(lambda: connections(status) == one), connections(status)
        finally:
            for w in waiters:
                w.kill()
                w.wait()
        assert wait_for(lambda: connections(status) == ())


def test_an_unwritable_status_is_logged_once_and_the_server_goes_on(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "connections"
    directory.mkdir()
    report = ConnectionsReport(directory, tmp_path / "absent-dir" / "status.json")
    assert not report.refresh(None) and not report.refresh(None)
    assert len([r for r in caplog.records if "not written" in r.message]) == 1
    (tmp_path / "absent-dir").mkdir()
    assert report.refresh(None) and connections(report.status) == ()
