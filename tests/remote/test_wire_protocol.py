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
OP_HELLO, OP_PING, OP_MEM_ALLOC, OP_MEM_FREE, OP_MEM_INFO, OP_MODULE_LOAD, OP_MODULE_FUNCTION = 1, 2, 8, 9, 10, 15, 17
OP_LAUNCH, OP_STREAM_SYNCHRONIZE, OP_EVENT_CREATE, OP_EVENT_RECORD, OP_EVENT_DESTROY = 18, 21, 24, 25, 29
OP_MODULE_UNLOAD, OP_CTX_SYNCHRONIZE, OP_COPY_TO_DEVICE, OP_COPY_TO_HOST = 16, 7, 11, 12
OP_LIBRARY_LOAD, OP_LIBRARY_UNLOAD, OP_LIBRARY_KERNEL, OP_LIBRARY_MODULE = 30, 31, 32, 33
OP_KERNEL_FUNCTION, OP_LIBRARY_GLOBAL = 34, 35
OP_FUNCTION_ATTRIBUTE, OP_FUNCTION_SET_ATTRIBUTE, OP_FUNCTION_CACHE_CONFIG = 36, 37, 38
OP_KERNEL_ATTRIBUTE, OP_KERNEL_SET_ATTRIBUTE, OP_KERNEL_CACHE_CONFIG = 39, 40, 41
OP_OCCUPANCY_BLOCKS, OP_OCCUPANCY_BLOCK_SIZE, OP_MODULE_GLOBAL = 42, 43, 44
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


def call(connection: socket.socket, op: int, number: int, payload: bytes = b"") -> tuple[int, bytes]:
    """(status, payload) of one answered request."""
    connection.sendall(frame(op, number, payload))
    _, got, status, answer = receive(connection)
    assert got == number
    return status, answer


def test_a_library_as_bytes(port: int) -> None:
    """CUDA 12's library API: a library's kernel carries its parameter layout, launches as a
    function, its module and global are answered, and everything from it goes with cuLibraryUnload."""
    connection, status = hello(port, token("a"))
    assert status == 0
    assert call(connection, OP_LIBRARY_LOAD, 2, b"not an image")[0] == 200  # the driver's INVALID_IMAGE
    status, payload = call(connection, OP_LIBRARY_LOAD, 3, b"gpupool-standin-module\nscale\nglobal table 64\n")
    assert status == 0
    library = struct.unpack("<Q", payload)[0]
    status, payload = call(connection, OP_LIBRARY_KERNEL, 4, struct.pack("<Q", library) + b"scale")
    assert status == 0
    kernel, params = struct.unpack_from("<QI", payload)
    assert (params, struct.unpack_from("<6I", payload, 12)) == (3, (0, 8, 8, 4, 12, 4))  # scale's offsets, sizes
    assert call(connection, OP_LIBRARY_KERNEL, 5, struct.pack("<Q", library) + b"matmul")[0] == 500  # NOT_FOUND
    status, payload = call(connection, OP_KERNEL_FUNCTION, 6, struct.pack("<Q", kernel))
    assert status == 0 and struct.unpack_from("<I", payload, 8)[0] == 3
    function = struct.unpack_from("<Q", payload)[0]
    status, payload = call(connection, OP_LIBRARY_GLOBAL, 7, struct.pack("<Q", library) + b"table")
    assert status == 0
    table, size = struct.unpack("<QQ", payload)
    assert size == 64
    status, payload = call(connection, OP_LIBRARY_MODULE, 8, struct.pack("<Q", library))
    assert status == 0
    module = struct.unpack("<Q", payload)[0]
    status, payload = call(connection, OP_MODULE_FUNCTION, 9, struct.pack("<Q", module) + b"scale")
    assert status == 0
    # a library's module goes with its library, never alone
    assert call(connection, OP_MODULE_UNLOAD, 10, struct.pack("<Q", module))[0] == INVALID_HANDLE
    # the global scaled by 3 through the kernel itself (CUDA 12 runtimes cast a CUkernel to CUfunction)
    values = struct.pack("<4f", 1, 2, 3, 4)
    connection.sendall(frame(OP_COPY_TO_DEVICE, 11, struct.pack("<QQ", table, 0) + values, flags=NO_REPLY))
    launch = struct.pack("<Q7IQ", kernel, 1, 1, 1, 1, 1, 1, 0, 0) + struct.pack("<QfI", table, 3.0, 4)
    connection.sendall(frame(OP_LAUNCH, 12, launch, flags=NO_REPLY))
    assert call(connection, OP_CTX_SYNCHRONIZE, 13)[0] == 0
    status, payload = call(connection, OP_COPY_TO_HOST, 14, struct.pack("<QQQ", table, 16, 0))
    assert (status, struct.unpack("<4f", payload)) == (0, (3, 6, 9, 12))
    assert call(connection, OP_LIBRARY_UNLOAD, 15, struct.pack("<Q", library))[0] == 0
    # gone with it: the library, its kernel, the kernel's function, its module
    launch = struct.pack("<Q7IQ", kernel, 1, 1, 1, 1, 1, 1, 0, 0) + struct.pack("<QfI", 0, 1.0, 0)
    connection.sendall(frame(OP_LAUNCH, 16, launch, flags=NO_REPLY) + frame(OP_PING, 17))
    assert receive(connection)[1:3] == (17, INVALID_HANDLE)
    assert call(connection, OP_KERNEL_FUNCTION, 18, struct.pack("<Q", kernel))[0] == INVALID_HANDLE
    launch = struct.pack("<Q7IQ", function, 1, 1, 1, 1, 1, 1, 0, 0) + struct.pack("<QfI", 0, 1.0, 0)
    connection.sendall(frame(OP_LAUNCH, 19, launch, flags=NO_REPLY) + frame(OP_PING, 20))
    assert receive(connection)[1:3] == (20, INVALID_HANDLE)
    assert call(connection, OP_MODULE_FUNCTION, 21, struct.pack("<Q", module) + b"scale")[0] == INVALID_HANDLE
    assert call(connection, OP_LIBRARY_GLOBAL, 22, struct.pack("<Q", library) + b"table")[0] == INVALID_HANDLE
    assert call(connection, OP_LIBRARY_UNLOAD, 23, struct.pack("<Q", library))[0] == INVALID_HANDLE
    assert call(connection, OP_LIBRARY_KERNEL, 24, struct.pack("<Q", 0xBAD0) + b"scale")[0] == INVALID_HANDLE
    assert call(connection, OP_LIBRARY_KERNEL, 25, struct.pack("<Q", library))[0] == 1  # short: INVALID_VALUE
    connection.close()


def handle(answer: tuple[int, bytes]) -> int:
    """The handle an answered request returned (its first 8 bytes)."""
    assert answer[0] == 0
    value: int = struct.unpack_from("<Q", answer[1])[0]
    return value


def test_a_function_got_through_two_owners_outlives_one(port: int) -> None:
    """The stand-in gives a library's module's function and the library kernel's function the same
    handle (known to the server once per owner); a module loaded from the same image has functions
    of its own, gone with it, and unloading it leaves the library's function valid until the
    library goes."""
    connection, status = hello(port, token("a"))
    assert status == 0
    image = b"gpupool-standin-module\nscale\n"
    module = struct.unpack("<Q", call(connection, OP_MODULE_LOAD, 2, image)[1])[0]
    library = struct.unpack("<Q", call(connection, OP_LIBRARY_LOAD, 3, image)[1])[0]
    from_module = handle(call(connection, OP_MODULE_FUNCTION, 4, struct.pack("<Q", module) + b"scale"))
    kernel = handle(call(connection, OP_LIBRARY_KERNEL, 5, struct.pack("<Q", library) + b"scale"))
    from_kernel = handle(call(connection, OP_KERNEL_FUNCTION, 6, struct.pack("<Q", kernel)))
    library_module = handle(call(connection, OP_LIBRARY_MODULE, 7, struct.pack("<Q", library)))
    from_library_module = handle(call(connection, OP_MODULE_FUNCTION, 8,
                                      struct.pack("<Q", library_module) + b"scale"))
    assert from_library_module == from_kernel != from_module
    assert call(connection, OP_MODULE_UNLOAD, 9, struct.pack("<Q", module))[0] == 0

    def launched(function: int, number: int) -> int:
        launch = struct.pack("<Q7IQ", function, 1, 1, 1, 1, 1, 1, 0, 0) + struct.pack("<QfI", 0, 1.0, 0)
        connection.sendall(frame(OP_LAUNCH, number, launch, flags=NO_REPLY) + frame(OP_PING, number + 1))
        _, ping, status = receive(connection)[:3]
        assert ping == number + 1
        return int(status)

    assert launched(from_kernel, 10) == 0
    assert launched(from_module, 12) == INVALID_HANDLE
    assert call(connection, OP_LIBRARY_UNLOAD, 14, struct.pack("<Q", library))[0] == 0
    assert launched(from_kernel, 15) == INVALID_HANDLE
    connection.close()


def test_attributes_occupancy_and_globals_as_bytes(port: int) -> None:
    """The attribute and occupancy calls take a function of the client's (or a library's kernel
    cast to one) and the kernel calls a kernel, else 400 before the driver; an occupancy callback
    table that does not cover the block sizes the driver tries fails with 801, never a guess; a
    module's global goes with its module."""
    connection, status = hello(port, token("a"))
    assert status == 0
    image = b"gpupool-standin-module\nvector_add\nglobal counter 64\n"
    module = handle(call(connection, OP_MODULE_LOAD, 2, image))
    function = handle(call(connection, OP_MODULE_FUNCTION, 3, struct.pack("<Q", module) + b"vector_add"))
    library = handle(call(connection, OP_LIBRARY_LOAD, 4, image))
    kernel = handle(call(connection, OP_LIBRARY_KERNEL, 5, struct.pack("<Q", library) + b"vector_add"))
    made_up = 0x7F00DEAD0000
    assert call(connection, OP_FUNCTION_ATTRIBUTE, 6, struct.pack("<Qi", function, 4)) == (0, struct.pack("<i", 32))
    assert call(connection, OP_FUNCTION_ATTRIBUTE, 7, struct.pack("<Qi", kernel, 4)) == (0, struct.pack("<i", 32))
    assert call(connection, OP_KERNEL_ATTRIBUTE, 8, struct.pack("<Qi", kernel, 4)) == (0, struct.pack("<i", 32))
    for number, (op, payload) in enumerate([
        (OP_FUNCTION_ATTRIBUTE, struct.pack("<Qi", made_up, 4)),
        (OP_FUNCTION_SET_ATTRIBUTE, struct.pack("<Qii", made_up, 8, 1024)),
        (OP_FUNCTION_CACHE_CONFIG, struct.pack("<QI", made_up, 1)),
        (OP_KERNEL_ATTRIBUTE, struct.pack("<Qi", function, 4)),  # a function is no kernel
        (OP_KERNEL_SET_ATTRIBUTE, struct.pack("<Qii", made_up, 8, 1024)),
        (OP_KERNEL_CACHE_CONFIG, struct.pack("<QI", module, 1)),
        (OP_OCCUPANCY_BLOCKS, struct.pack("<QiIQ", made_up, 256, 0, 0)),
        (OP_OCCUPANCY_BLOCK_SIZE, struct.pack("<QQiII", made_up, 0, 0, 0, 0)),
        (OP_MODULE_GLOBAL, struct.pack("<Q", library) + b"counter"),  # a library is no module
    ], start=10):
        assert call(connection, op, number, payload)[0] == INVALID_HANDLE, op
    assert call(connection, OP_FUNCTION_SET_ATTRIBUTE, 30, struct.pack("<Qi", function, 8))[0] == 1  # short
    assert call(connection, OP_OCCUPANCY_BLOCKS, 31, struct.pack("<QiIQ", function, 256, 0, 0)) == \
        (0, struct.pack("<i", 8))
    # callback answers for block sizes 1..10 only: the driver tries up to 1024
    short_table = struct.pack("<QQiII", function, 0, 0, 0, 10) + bytes(80)
    assert call(connection, OP_OCCUPANCY_BLOCK_SIZE, 32, short_table)[0] == 801
    # ... and a table that claims more entries than it carries is refused
    assert call(connection, OP_OCCUPANCY_BLOCK_SIZE, 33, struct.pack("<QQiII", function, 0, 0, 0, 10))[0] == 1
    full_table = struct.pack("<QQiII", function, 0, 0, 0, 1024) + bytes(8 * 1024)
    assert call(connection, OP_OCCUPANCY_BLOCK_SIZE, 34, full_table) == (0, struct.pack("<ii", 16, 1024))
    assert call(connection, OP_MODULE_GLOBAL, 35, struct.pack("<Q", module) + b"counter")[0] == 0
    assert call(connection, OP_MODULE_UNLOAD, 36, struct.pack("<Q", module))[0] == 0
    assert call(connection, OP_MODULE_GLOBAL, 37, struct.pack("<Q", module) + b"counter")[0] == INVALID_HANDLE
    assert call(connection, OP_FUNCTION_ATTRIBUTE, 38, struct.pack("<Qi", function, 4))[0] == INVALID_HANDLE
    connection.close()
