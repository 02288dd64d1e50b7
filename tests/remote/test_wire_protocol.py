"""The wire protocol as bytes (gpupool/shim/src/remote/protocol.h), spoken by this test directly to
the C server on the stand-in driver: replies carry call ids and CUDA error codes, and a client
that sends nonsense loses only its own connection."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.remotegpu.serve import mirror_text
from gpupool.shim.build import build_standin
from gpupool.shim.remote_build import build_server
from tests.remote.remote_support import client, token

HEADER = struct.Struct("<IHHIi")
OP_HELLO, OP_PING, OP_MEM_ALLOC, OP_MEM_FREE, OP_MEM_INFO, OP_MODULE_FUNCTION = 1, 2, 8, 9, 10, 17
OP_LAUNCH, OP_STREAM_SYNCHRONIZE, OP_EVENT_CREATE, OP_EVENT_RECORD, OP_EVENT_DESTROY = 18, 21, 24, 25, 29
INVALID_HANDLE = 400
NO_REPLY = 1


@pytest.fixture
def port(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "clients.tab").write_text(mirror_text([client("a", memory_mib=64)]))
    env = {**os.environ, "GPUPOOL_STANDIN_STATE": str(tmp_path / "standin.state")}
    server = subprocess.Popen([str(build_server(werror=True)), "--listen", "127.0.0.1:0", "--clients",
                               str(tmp_path / "clients.tab"), "--driver", str(build_standin() / "libcuda.so.1")],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert server.stdout is not None
        yield int(server.stdout.readline().split()[-1])
        assert server.poll() is None, "the server itself must survive every client"
    finally:
        server.kill()
        server.wait()


def frame(op: int, call: int, payload: bytes = b"", flags: int = 0) -> bytes:
    return HEADER.pack(len(payload), op, flags, call, 0) + payload


def receive(connection: socket.socket) -> tuple[int, int, int, bytes]:
    """(op, call, status, payload) of one reply."""
    head = b""
    while len(head) < HEADER.size:
        chunk = connection.recv(HEADER.size - len(head))
        assert chunk, "connection closed"
        head += chunk
    length, op, _, call, status = HEADER.unpack(head)
    payload = b""
    while len(payload) < length:
        payload += connection.recv(length - len(payload))
    return op, call, status, payload


def closed(connection: socket.socket) -> bool:
    """Whether the server hung up (closed, or reset when our bytes were left unread)."""
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True


def hello(port: int, secret: str) -> tuple[socket.socket, int]:
    connection = socket.create_connection(("127.0.0.1", port), timeout=10)
    connection.sendall(frame(OP_HELLO, 1, struct.pack("<I", 1) + secret.encode()))
    _, call, status, payload = receive(connection)
    assert call == 1
    if status == 0:
        assert struct.unpack("<QQ", payload) == (1, 64 << 20)  # version, booked bytes
    return connection, status


def test_calls_and_errors_as_bytes(port: int) -> None:
    connection, status = hello(port, token("a"))
    assert status == 0
    connection.sendall(frame(OP_MEM_ALLOC, 7, struct.pack("<Q", 65 << 20)))
    assert receive(connection)[1:3] == (7, 2)  # over the share: CUDA_ERROR_OUT_OF_MEMORY
    connection.sendall(frame(OP_MEM_ALLOC, 8, struct.pack("<Q", 1 << 20)))
    _, call, status, payload = receive(connection)
    assert (call, status) == (8, 0)
    pointer = struct.unpack("<Q", payload)[0]
    connection.sendall(frame(OP_MEM_INFO, 9))
    assert struct.unpack("<QQ", receive(connection)[3]) == (63 << 20, 64 << 20)
    # an error of a call that wants no reply comes back with the next answered one
    connection.sendall(frame(OP_MEM_FREE, 10, struct.pack("<Q", 12345), flags=NO_REPLY) + frame(OP_PING, 11))
    assert receive(connection)[1:3] == (11, 1)  # CUDA_ERROR_INVALID_VALUE, reported once
    connection.sendall(frame(OP_PING, 12) + frame(OP_MEM_FREE, 13, struct.pack("<Q", pointer)))
    assert receive(connection)[1:3] == (12, 0)
    assert receive(connection)[1:3] == (13, 0)
    connection.sendall(frame(999, 14) + frame(OP_MEM_ALLOC, 15, b"\x01"))
    assert receive(connection)[1:3] == (14, 801)  # unknown operation: CUDA_ERROR_NOT_SUPPORTED
    assert receive(connection)[1:3] == (15, 1)  # payload too short: CUDA_ERROR_INVALID_VALUE
    connection.sendall(frame(OP_MODULE_FUNCTION, 16, struct.pack("<Q", 0) + b"nothing"))
    assert receive(connection)[1:3] == (16, INVALID_HANDLE)  # not a module of this client's
    connection.close()


def test_handles_the_driver_did_not_give_this_client_are_refused(port: int) -> None:
    """A made-up or another client's handle never reaches the driver: CUDA_ERROR_INVALID_HANDLE."""
    connection, status = hello(port, token("a"))
    assert status == 0
    launch = struct.pack("<Q7IQ", 0x7F00DEAD0000, 1, 1, 1, 1, 1, 1, 0, 0) + bytes(8)
    connection.sendall(frame(OP_LAUNCH, 2, launch, flags=NO_REPLY) + frame(OP_PING, 3))
    assert receive(connection)[1:3] == (3, INVALID_HANDLE)
    connection.sendall(frame(OP_STREAM_SYNCHRONIZE, 4, struct.pack("<Q", 0xBAD0)))
    assert receive(connection)[1:3] == (4, INVALID_HANDLE)
    connection.sendall(frame(OP_STREAM_SYNCHRONIZE, 5, struct.pack("<Q", 0)))  # the default stream
    assert receive(connection)[1:3] == (5, 0)
    connection.sendall(frame(OP_EVENT_CREATE, 6, struct.pack("<I", 0)))
    _, _, status, payload = receive(connection)
    assert status == 0
    event = struct.unpack("<Q", payload)[0]
    connection.sendall(frame(OP_EVENT_RECORD, 7, struct.pack("<QQ", event, 0)))
    assert receive(connection)[1:3] == (7, 0)
    connection.sendall(frame(OP_EVENT_DESTROY, 8, struct.pack("<Q", event)))
    assert receive(connection)[1:3] == (8, 0)
    connection.sendall(frame(OP_EVENT_RECORD, 9, struct.pack("<QQ", event, 0)))  # destroyed: gone
    assert receive(connection)[1:3] == (9, INVALID_HANDLE)
    connection.close()


def test_a_forged_token_is_refused_and_hung_up_on(port: int) -> None:
    connection, status = hello(port, token("b"))
    assert status == 800
    assert closed(connection)


def test_nonsense_costs_only_its_own_connection(port: int) -> None:
    connection, status = hello(port, token("a"))
    assert status == 0
    connection.sendall(HEADER.pack(0xFFFFFFFF, OP_PING, 0, 2, 0))  # a 4 GiB request: hung up on
    assert closed(connection)
    garbage = socket.create_connection(("127.0.0.1", port), timeout=10)
    garbage.sendall(os.urandom(4096))
    assert closed(garbage)
    survivor, status = hello(port, token("a"))
    assert status == 0
    survivor.sendall(frame(OP_PING, 2))
    assert receive(survivor)[1:3] == (2, 0)
