"""The C server on its own: connections that never say hello are bounded in number and in time."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from gpupool.shim.build import build_standin
from gpupool.shim.remote_build import build_server

# Servers and programs started per case (seconds each): scripts/test-all runs them, plain pytest does not.
pytestmark = pytest.mark.slow


def test_connections_past_the_cap_are_closed_and_silent_ones_end(tmp_path: Path) -> None:
    (tmp_path / "clients.tab").write_text("")
    env = {**os.environ, "GPUPOOL_STANDIN_STATE": str(tmp_path / "standin.state")}
    server = subprocess.Popen([str(build_server(werror=True)), "--listen", "127.0.0.1:0", "--clients",
                               str(tmp_path / "clients.tab"), "--driver", str(build_standin() / "libcuda.so.1"),
                               "--max-clients", "2"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[-1])
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        time.sleep(0.5)
        third = socket.create_connection(("127.0.0.1", port))
        third.settimeout(2)
        assert third.recv(1) == b""  # closed at once: two processes already
        for connection in silent:  # the hello deadline (5 s) ends them
            connection.settimeout(10)
            assert connection.recv(1) == b""
        time.sleep(0.5)
        again = socket.create_connection(("127.0.0.1", port))
        again.settimeout(1)
        try:
            again.recv(1)
            raise AssertionError("a connection was closed although the earlier ones ended")
        except TimeoutError:
            pass
        for connection in (*silent, third, again):
            connection.close()
    finally:
        server.kill()
        server.wait()
