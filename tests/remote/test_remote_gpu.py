"""The remote GPU's data plane end to end on this machine: a CUDA driver API program linked
against the GPU client computes on the stand-in driver behind a GPU server (docs/remote-gpu.md).

The stand-in driver's built-in kernels compute on host-backed device memory, so results are read
back and checked; its cards' memory is shared by the server's client processes as a real card's
is, so a client's release is seen by the next one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.remote.remote_support import (
    Programs,
    build_programs,
    client,
    probe_env,
    run_probe,
    running_server,
    token,
    wait_line,
    write_clients,
)

CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_DEVICE_UNAVAILABLE = 46
CUDA_ERROR_NOT_PERMITTED = 800
CUDA_ERROR_TIMEOUT = 909

# Servers and programs started per case (seconds each): scripts/test-all runs them, plain pytest does not.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return build_programs(tmp_path_factory.mktemp("remote-programs"))


def endpoint(port: int) -> str:
    return f"127.0.0.1:{port}"


def test_vector_add_over_loopback(programs: Programs, tmp_path: Path) -> None:
    with running_server(programs, tmp_path, [client("a")]) as server:
        out = run_probe(programs, probe_env(programs, endpoint(server.port), token("a")), "vector_add", "100000")
    assert out == "ok vector_add 100000 c[99999]=149998"


def test_page_locked_host_memory_is_plain_memory_here(programs: Programs, tmp_path: Path) -> None:
    with running_server(programs, tmp_path, [client("a")]) as server:
        env = {**probe_env(programs, endpoint(server.port), token("a")), "PROBE_PINNED": "1"}
        out = run_probe(programs, env, "vector_add", "1000")
    assert out == "ok vector_add 1000 c[999]=1498.5"


def test_the_same_program_computes_the_same_on_the_driver_itself(programs: Programs, tmp_path: Path) -> None:
    """The reference: the probe run directly on the stand-in gives the same line."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(programs.standin), "GPUPOOL_STANDIN_STATE": str(tmp_path / "s"),
           "GPUPOOL_STANDIN_KERNEL_US": "1"}
    assert run_probe(programs, env, "vector_add", "100000") == "ok vector_add 100000 c[99999]=149998"


def test_entry_points_from_cuGetProcAddress(programs: Programs, tmp_path: Path) -> None:
    """A runtime finds the forwarding entry points by name; one this library does not forward
    answers CUDA_ERROR_NOT_SUPPORTED instead of being missing."""
    with running_server(programs, tmp_path, [client("a")]) as server:
        out = run_probe(programs, probe_env(programs, endpoint(server.port), token("a")), "lookup")
    assert out == "lookup 0 801"


def test_forged_token_refused(programs: Programs, tmp_path: Path) -> None:
    with running_server(programs, tmp_path, [client("a")]) as server:
        out = run_probe(programs, probe_env(programs, endpoint(server.port), token("b")), "vector_add", "10")
    assert out == f"error {CUDA_ERROR_NOT_PERMITTED} at cuInit(0)"


def test_memory_over_the_booked_share_refused(programs: Programs, tmp_path: Path) -> None:
    with running_server(programs, tmp_path, [client("a", memory_mib=256)]) as server:
        env = probe_env(programs, endpoint(server.port), token("a"))
        over = run_probe(programs, env, "alloc", "257")
        within = run_probe(programs, env, "alloc", "256")
    mib = 1 << 20
    assert over == f"alloc {CUDA_ERROR_OUT_OF_MEMORY} free {256 * mib} total {256 * mib}"
    assert within == f"alloc 0 free 0 total {256 * mib}"


def test_a_killed_client_releases_its_memory(programs: Programs, tmp_path: Path) -> None:
    """Two clients of a 300 MiB card: the second gets 200 MiB only once the first, holding 200,
    was killed (its server process exits and the card's memory comes back)."""
    with running_server(programs, tmp_path, [client("a"), client("b")], card_mib=300) as server:
        holder = subprocess.Popen([str(programs.probe), "hold", "200"], stdout=subprocess.PIPE, text=True,
                                  env=probe_env(programs, endpoint(server.port), token("a")))
        try:
            assert wait_line(holder, 30) == "held 200"
            env_b = probe_env(programs, endpoint(server.port), token("b"))
            assert run_probe(programs, env_b, "alloc", "200").startswith(f"alloc {CUDA_ERROR_OUT_OF_MEMORY} ")
        finally:
            holder.kill()
            holder.wait()
        deadline = time.monotonic() + 10
        while (out := run_probe(programs, env_b, "alloc", "200")).startswith("alloc 2 ") \
                and time.monotonic() < deadline:
            time.sleep(0.1)
    assert out.startswith("alloc 0 ")


def test_server_killed_mid_copy_gives_an_error_not_a_hang(programs: Programs, tmp_path: Path) -> None:
    with running_server(programs, tmp_path, [client("a")]) as server:
        copier = subprocess.Popen([str(programs.probe), "copy_loop", "64"], stdout=subprocess.PIPE, text=True,
                                  env=probe_env(programs, endpoint(server.port), token("a"), deadline_ms=20000))
        try:
            assert wait_line(copier, 30) == "copying"
            time.sleep(0.3)
            killed = time.monotonic()
            server.kill()
            line = wait_line(copier, 10)
            took = time.monotonic() - killed
        finally:
            copier.kill()
            copier.wait()
    assert line.startswith(f"error {CUDA_ERROR_DEVICE_UNAVAILABLE} after "), line
    assert took < 5  # the connection's end, not the 20 s deadline


def test_a_silent_server_gives_a_timeout_at_the_deadline(programs: Programs, tmp_path: Path) -> None:
    """A server that stops answering (stopped, or a cut network: no reset) costs one deadline."""
    with running_server(programs, tmp_path, [client("a")]) as server:
        waiter = subprocess.Popen([str(programs.probe), "wait_loop"], stdout=subprocess.PIPE, text=True,
                                  env=probe_env(programs, endpoint(server.port), token("a"), deadline_ms=1000))
        try:
            assert wait_line(waiter, 30) == "waiting"
            for pid in server.client_processes():
                os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic()
            line = wait_line(waiter, 10)
            took = time.monotonic() - stopped
        finally:
            waiter.kill()
            waiter.wait()
    assert line == f"error {CUDA_ERROR_TIMEOUT}"
    assert 0.5 < took < 5


def test_a_client_removed_from_the_file_is_disconnected(programs: Programs, tmp_path: Path) -> None:
    with running_server(programs, tmp_path, [client("a"), client("b")]) as server:
        waiter = subprocess.Popen([str(programs.probe), "wait_loop"], stdout=subprocess.PIPE, text=True,
                                  env=probe_env(programs, endpoint(server.port), token("a")))
        try:
            assert wait_line(waiter, 30) == "waiting"
            write_clients(server.clients_file, [client("b")])
            removed = time.monotonic()
            line = wait_line(waiter, 10)
            took = time.monotonic() - removed
        finally:
            waiter.kill()
            waiter.wait()
        still = run_probe(programs, probe_env(programs, endpoint(server.port), token("b")), "vector_add", "10")
        again = run_probe(programs, probe_env(programs, endpoint(server.port), token("a")), "vector_add", "10")
    assert line == f"error {CUDA_ERROR_DEVICE_UNAVAILABLE}"
    assert took < 3
    assert still.startswith("ok vector_add")
    assert again == f"error {CUDA_ERROR_NOT_PERMITTED} at cuInit(0)"


def test_the_client_reads_the_grant_file(programs: Programs, tmp_path: Path) -> None:
    """Without the environment's variables the client takes remote_endpoint and remote_token from
    the node's grant file (the test build's grant path is beside the probe)."""
    grant = programs.probe.parent / "grant"
    with running_server(programs, tmp_path, [client("a")]) as server:
        grant.write_text(f"version=1\nmemory_mib=256\nregion=/x\nremote_endpoint={endpoint(server.port)}\n"
                         f"remote_token={token('a')}\n")
        env = {k: v for k, v in probe_env(programs, "", "").items() if not k.startswith("GPUPOOL_REMOTE_")}
        try:
            out = run_probe(programs, env, "vector_add", "10")
        finally:
            grant.unlink()
    assert out.startswith("ok vector_add 10")


def test_the_client_reads_the_grant_directory_before_the_grant_file(programs: Programs, tmp_path: Path) -> None:
    """GPUPOOL_REMOTE_DIR names the pod's mounted grant Secret (a file per key, as kubelet writes a
    Secret volume): its endpoint and token are used, the node's grant file is not read; with no
    remote_tls_ca.pem there the connection is plain."""
    grant, secret = programs.probe.parent / "grant", tmp_path / "secret"
    secret.mkdir()
    with running_server(programs, tmp_path, [client("a")]) as server:
        (secret / "remote_endpoint").write_text(endpoint(server.port))  # no newline, as a Secret's key
        (secret / "remote_token").write_text(f"{token('a')}\n")
        grant.write_text(f"remote_endpoint={endpoint(server.port)}\nremote_token={token('b')}\n")  # not served
        env = {k: v for k, v in probe_env(programs, "", "").items() if not k.startswith("GPUPOOL_REMOTE_")}
        try:
            out = run_probe(programs, {**env, "GPUPOOL_REMOTE_DIR": str(secret)}, "vector_add", "10")
            (secret / "remote_token").unlink()
            missing = run_probe(programs, {**env, "GPUPOOL_REMOTE_DIR": str(secret)}, "vector_add", "10")
        finally:
            grant.unlink()
    assert out.startswith("ok vector_add 10")
    assert missing == "error 100 at cuInit(0)"  # no token in the directory: not the grant file's


def test_no_server_configured(programs: Programs) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_REMOTE_")}
    env["LD_LIBRARY_PATH"] = str(programs.client)
    assert run_probe(programs, env, "vector_add", "10") == "error 100 at cuInit(0)"


def test_nothing_listening_is_tried_again_until_the_deadline(programs: Programs) -> None:
    started = time.monotonic()
    out = run_probe(programs, probe_env(programs, "127.0.0.1:1", token("a"), deadline_ms=1500), "vector_add", "10")
    assert out == f"error {CUDA_ERROR_DEVICE_UNAVAILABLE} at cuInit(0)"
    assert 0.5 <= time.monotonic() - started < 5  # tried again within the 1.5 s deadline, not the 10 s window


def test_a_server_that_starts_after_the_client_is_reached(programs: Programs, tmp_path: Path) -> None:
    """The GPU node's agent may start its server after the pod's program has started: a refused
    connection is tried again (up to 10 s), so the program computes instead of failing at cuInit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    early = subprocess.Popen([str(programs.probe), "vector_add", "1000"],
                             env=probe_env(programs, endpoint(port), token("a")), stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        with running_server(programs, tmp_path, [client("a")], listen=f"127.0.0.1:{port}"):
            out, _ = early.communicate(timeout=60)
    finally:
        early.kill()
    assert out.strip() == "ok vector_add 1000 c[999]=1498.5"
