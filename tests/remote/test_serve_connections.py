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

from gpupool.api.remote_connections import (
    CONNECTIONS_FILE,
    ClientConnections,
    ConnectionsFileError,
    decode_connections,
    encode_connections,
)
from gpupool.api.remote_gpu import RemoteClient
from gpupool.core.model import GpuCard, Topology
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.remote_usage import remote_client_rows
from gpupool.remotegpu import serve as serve_module
from gpupool.remotegpu.serve import (
    SM_READ_S,
    ConnectionLine,
    ConnectionsReport,
    SmReadings,
    live_connections,
    measured_sm_percent,
    parse_connection_line,
    summed,
)
from gpupool.shim import region as layout
from gpupool.testing.shim_regions import region_bytes
from tests.remote.remote_support import (
    CARD,
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


def counts(path: Path) -> tuple[ClientConnections, ...]:
    """The entries with the connection counts only (what the client uses left out)."""
    return tuple(ClientConnections(e.pod, e.card_uuid, e.connections) for e in connections(path))


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
        assert live_connections(directory, os.getpid()) == [ClientConnections("ns/pod-a", "GPU-0", 1)]
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
            assert wait_for(lambda: counts(status) == expected), connections(status)
            refused = run_probe(programs, probe_env(programs, endpoint, "x" * 43), "vector_add", "10")
            assert refused.startswith("error")
            assert counts(status) == expected
            # the node agent's reader finds the server's report beside the clients file it wrote
            rows = remote_client_rows(server.clients_file, INVENTORY)
            assert [(r.pod, r.card, r.connections) for r in rows] == [("pod-a", 0, 2), ("pod-b", 0, 0)]
            text = status.read_text()
            assert token("a") not in text and token("b") not in text
            waiters[0].kill()  # killed: its server process ends with the connection
            waiters[0].wait()
            one = (ClientConnections("ns/pod-a", "GPU-standin-0", 1),)
            assert wait_for(lambda: counts(status) == one), connections(status)
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


MIB = 1 << 20


def region_with(tmp_path: Path, ordinal: int, compute_percent: int, util_percent: int) -> Path:
    """An interception-library region whose card ``ordinal`` has a compute share and a measurement."""
    data = bytearray(region_bytes({ordinal: (0, util_percent)}))
    offset = layout.DEVICES_OFFSET + ordinal * layout.DEVICE.size
    fields = list(layout.DEVICE.unpack_from(data, offset))
    fields[2] = compute_percent  # the device record: used, memory_limit, compute_percent, ...
    layout.DEVICE.pack_into(data, offset, *fields)
    path = tmp_path / f"region-{ordinal}-{compute_percent}-{util_percent}"
    path.write_bytes(bytes(data))
    return path


def test_a_connections_line_carries_since_held_and_where_sm_use_is_measured() -> None:
    assert parse_connection_line("ns/a\tGPU-0\t1700000000\t4096\t1\t/tmp/x/memory.region\n") == \
        ConnectionLine("ns/a", "GPU-0", 1700000000, 4096, 1, "/tmp/x/memory.region")
    assert parse_connection_line("ns/a\tGPU-0\t1700000000\t0\t-1\t\n") == ConnectionLine("ns/a", "GPU-0", 1700000000, 0)
    # a server from before the figures: pod and card only, the figures unknown (not 0)
    assert parse_connection_line("ns/a\tGPU-0\n") == ConnectionLine("ns/a", "GPU-0")
    assert parse_connection_line("ns/a\tGPU-0\tsoon\t1\t2\t\n") == ConnectionLine("ns/a", "GPU-0")
    assert parse_connection_line("\n") is None


def test_figures_are_summed_per_client_and_since_is_the_oldest_connection(tmp_path: Path) -> None:
    measured = region_with(tmp_path, 0, 30, 42)
    lines = [ConnectionLine("ns/a", "GPU-0", 200, 64 * MIB, 0, str(measured)),
             ConnectionLine("ns/a", "GPU-0", 100, 32 * MIB, 0, str(region_with(tmp_path, 0, 30, 70))),
             ConnectionLine("ns/b", "GPU-0", 300, 0),
             ConnectionLine("ns/c", "GPU-0", 300, 5, 0, str(region_with(tmp_path, 0, 0, 50))),  # no share
             ConnectionLine("ns/c", "GPU-0")]  # an older server's line: the sum is not known
    assert summed(lines) == [ClientConnections("ns/a", "GPU-0", 2, 96 * MIB, 100, 100),  # 42 + 70, at most the card
                             ClientConnections("ns/b", "GPU-0", 1, 0, 300, None),
                             ClientConnections("ns/c", "GPU-0", 2, None, 300, None)]
    assert measured_sm_percent(ConnectionLine("ns/a", "GPU-0", 1, 1, 0, str(measured))) == 42
    assert measured_sm_percent(ConnectionLine("ns/a", "GPU-0", 1, 1, 0, str(tmp_path / "gone"))) is None
    assert measured_sm_percent(ConnectionLine("ns/a", "GPU-0", 1, 1, 1, str(measured))) is None  # no share on card 1


def test_the_connections_file_round_trips_the_figures_and_reads_an_older_one() -> None:
    entry = ClientConnections("ns/a", "GPU-0", 2, 96 * MIB, 1700000000, 35)
    assert decode_connections(encode_connections([entry])) == (entry,)
    older = '{"version": 1, "connections": [{"pod": "ns/a", "card_uuid": "GPU-0", "connections": 1}]}'
    assert decode_connections(older) == (ClientConnections("ns/a", "GPU-0", 1, None, None, None),)
    with pytest.raises(ConnectionsFileError):
        decode_connections(older.replace('"connections": 1}', '"connections": 1, "memory_used_bytes": -1}'))


def test_region_reads_are_cached_for_a_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = region_with(tmp_path, 0, 30, 10)
    line = ConnectionLine("ns/a", "GPU-0", 1, 0, 0, str(path))
    clock = [100.0]
    monkeypatch.setattr(serve_module.time, "monotonic", lambda: clock[0])
    readings = SmReadings()
    assert readings(line) == 10
    path.write_bytes(region_with(tmp_path, 0, 30, 60).read_bytes())
    clock[0] += SM_READ_S / 2
    assert readings(line) == 10
    clock[0] += SM_READ_S
    assert readings(line) == 60
    readings.keep_only([])
    assert readings._last == {}


def client_use(status: Path, pod: str) -> ClientConnections | None:
    return next((e for e in connections(status) if e.pod == pod), None)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--enforce-compute"]], ids=["direct", "executor"])
def test_a_clients_memory_and_since_are_reported_while_it_holds_them(programs: Programs, tmp_path: Path,
                                                                     extra: list[str]) -> None:
    """The bytes the client's allocations hold, summed over its connections, within about 100 ms of
    a change, and since when it is connected (its oldest live connection)."""
    status = tmp_path / CONNECTIONS_FILE
    with running_server(programs, tmp_path, [client("a")], extra=extra) as server:
        endpoint = f"127.0.0.1:{server.port}"
        before = int(time.time())
        holders = [subprocess.Popen([str(programs.probe), "hold", str(mib)], stdout=subprocess.PIPE, text=True,
                                    env=probe_env(programs, endpoint, token("a"))) for mib in (64, 32)]
        try:
            assert [wait_line(h, 30) for h in holders] == ["held 64", "held 32"]
            after = int(time.time())
            assert wait_for(lambda: getattr(client_use(status, "ns/pod-a"), "memory_used_bytes", 0) == 96 * MIB), \
                connections(status)
            use = client_use(status, "ns/pod-a")
            assert use is not None and use.connections == 2
            assert use.connected_since is not None and before <= use.connected_since <= after
            assert use.sm_percent is None  # no compute share: nothing measures the client's SM use
            rows = remote_client_rows(server.clients_file, INVENTORY)  # what the node agent reports
            assert [(r.memory_used_bytes, r.connected_since) for r in rows] == [(96 * MIB, use.connected_since)]
            holders[0].kill()
            holders[0].wait()
            assert wait_for(lambda: getattr(client_use(status, "ns/pod-a"), "memory_used_bytes", 0) == 32 * MIB), \
                connections(status)
        finally:
            for h in holders:
                h.kill()
                h.wait()
        assert wait_for(lambda: connections(status) == ())


@pytest.mark.slow
def test_a_clients_sm_use_is_reported_where_the_library_measures_it(programs: Programs, tmp_path: Path) -> None:
    """Under --enforce-compute with a compute share, the interception library's controller measures
    the client's executor on the card (the stand-in's NVML): the report carries it while it runs."""
    status = tmp_path / CONNECTIONS_FILE
    share = RemoteClient(token("a"), "ns/pod-a", CARD, 256, 30)
    timeline = {"GPUPOOL_STANDIN_KERNEL_US": "4000", "GPUPOOL_STANDIN_QUEUE_US": "20000"}
    with running_server(programs, tmp_path, [share], extra=["--enforce-compute"], card=timeline) as server:
        launcher = subprocess.Popen([str(programs.probe), "launch_for", "4000"], stdout=subprocess.PIPE, text=True,
                                    env=probe_env(programs, f"127.0.0.1:{server.port}", token("a")))
        try:
            assert wait_for(lambda: (getattr(client_use(status, "ns/pod-a"), "sm_percent", None) or 0) > 0, 20), \
                connections(status)
            assert "region" not in status.read_text()  # where it was read stays with the server
        finally:
            launcher.kill()
            launcher.wait()
