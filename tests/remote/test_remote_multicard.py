"""A remote share of two cards of one GPU node (docs/remote-gpu.md, "Several cards"): the GPU client
sees two devices, device i the i-th booked card, each holding the whole booked memory against what
the client holds on that card; the stand-in driver (two 300 MiB cards) behind the real server.

A share of 256 MiB on each of two 300 MiB cards proves the allocations land on distinct cards: both
wholes fit at once only because device 1's went to the second card.
"""

from __future__ import annotations

import socket
import struct
import subprocess
from pathlib import Path

import pytest

from gpupool.api.remote_gpu import RemoteClient
from tests.remote.remote_support import (
    Programs,
    build_client_program,
    build_programs,
    client,
    probe_env,
    run_probe,
    running_server,
    token,
)
from tests.remote.test_wire_protocol import OP_HELLO, OP_MEM_INFO, frame, receive

pytestmark = pytest.mark.slow  # a server started per case
PROBE = Path(__file__).with_name("multicard_probe.c")
RUNTIME_PROBE = Path(__file__).with_name("multicard_runtime_probe.c")
MIB = 1 << 20
TWO_CARDS = {"GPUPOOL_STANDIN_DEVICES": "2"}
FLAG_HELLO_DEVICES = 2  # protocol.h REMOTE_FLAG_HELLO_DEVICES
OP_SET_DEVICE = 64
CUDA_ERROR_INVALID_DEVICE = 101


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Programs, Path]:
    out = tmp_path_factory.mktemp("multicard-programs")
    built = build_programs(out)
    return built, build_client_program(PROBE, out / "multicard_probe", built)


def two_card_client(letter: str = "a") -> RemoteClient:
    return RemoteClient(token(letter), f"ns/pod-{letter}", "GPU-standin-0", 256, 0,
                        more_card_uuids=("GPU-standin-1",))


def run(probe: Path, env: dict[str, str]) -> str:
    return subprocess.run([str(probe), "256"], env=env, capture_output=True, text=True, timeout=60,
                          check=False).stdout


EXPECTED = (
    "count 2 third 101\n"
    "uuids differ 1\n"
    f"device 0 alloc whole 0 one more 2 free 0 total {256 * MIB}\n"
    f"device 1 alloc whole 0 one more 2 free 0 total {256 * MIB}\n"
    f"device 0 after free: free {256 * MIB}\n"
    "device 1 still: free 0\n"
    "vector_add on device 1 c[999]=2997\n"
    "peer copy 801\n"
)


@pytest.mark.parametrize("extra", [(), ("--enforce-compute",)], ids=["plain", "under-the-interception-library"])
def test_two_booked_cards_are_two_devices_each_held_to_its_share(
        programs: tuple[Programs, Path], tmp_path: Path, extra: tuple[str, ...]) -> None:
    built, probe = programs
    with running_server(built, tmp_path, [two_card_client()], card_mib=300, card=TWO_CARDS, extra=extra) as server:
        out = run(probe, probe_env(built, f"127.0.0.1:{server.port}", token("a")))
    assert out == EXPECTED


def test_a_one_card_client_beside_it_sees_one_device_and_its_card_only(
        programs: tuple[Programs, Path], tmp_path: Path) -> None:
    """The one-card client of before (one device, its 256 MiB) beside a two-card client."""
    built, probe = programs
    with running_server(built, tmp_path, [two_card_client(), client("b")], card_mib=600, card=TWO_CARDS) as server:
        one = probe_env(built, f"127.0.0.1:{server.port}", token("b"))
        assert run(probe, one) == "count 1 third 101\nerror 101 at cuDeviceGet(&device, i)\n"
        assert run_probe(built, one, "vector_add", "1000") == "ok vector_add 1000 c[999]=1498.5"
        assert run_probe(built, one, "alloc", "257") == f"alloc 2 free {256 * MIB} total {256 * MIB}"
        assert run(probe, probe_env(built, f"127.0.0.1:{server.port}", token("a"))) == EXPECTED


def test_a_card_the_node_lacks_refuses_the_client_at_its_hello(programs: tuple[Programs, Path],
                                                                tmp_path: Path) -> None:
    built, probe = programs
    missing = RemoteClient(token("a"), "ns/pod-a", "GPU-standin-0", 256, 0, more_card_uuids=("GPU-standin-5",))
    with running_server(built, tmp_path, [missing], card_mib=300, card=TWO_CARDS) as server:
        out = run(probe, probe_env(built, f"127.0.0.1:{server.port}", token("a")))
    assert out == "error 100 at cuInit(0)\n"


def test_the_hello_gives_the_device_count_only_to_a_client_that_asks(programs: tuple[Programs, Path],
                                                                      tmp_path: Path) -> None:
    """A client from before several cards (no REMOTE_FLAG_HELLO_DEVICES) gets the two words it reads,
    and its calls run on the share's first card; the flag adds the third word, the device count."""
    built, _ = programs
    with running_server(built, tmp_path, [two_card_client()], card_mib=300, card=TWO_CARDS) as server:
        for flags, words in ((0, (1, 256 * MIB)), (FLAG_HELLO_DEVICES, (1, 256 * MIB, 2))):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
                connection.sendall(frame(OP_HELLO, 1, struct.pack("<I", 1) + token("a").encode(), flags))
                op, call, status, payload = receive(connection)
                assert (op, call, status) == (OP_HELLO, 1, 0)
                assert struct.unpack(f"<{len(words)}Q", payload) == words
                connection.sendall(frame(OP_MEM_INFO, 2))
                assert struct.unpack("<QQ", receive(connection)[3]) == (256 * MIB, 256 * MIB)
                connection.sendall(frame(OP_SET_DEVICE, 3, struct.pack("<I", 2)))
                assert receive(connection)[2] == CUDA_ERROR_INVALID_DEVICE


def run_runtime_probe(built: Programs, tmp_path: Path, argument: str) -> str:
    """multicard_runtime_probe.c linked to gpupool's runtime, run with argument against a server of
    the two-card share."""
    runtime_probe = build_client_program(RUNTIME_PROBE, tmp_path / "multicard_runtime_probe", built, ("-lcudart",))
    with running_server(built, tmp_path, [two_card_client()], card_mib=300, card=TWO_CARDS) as server:
        return subprocess.run([str(runtime_probe), argument],
                              env=probe_env(built, f"127.0.0.1:{server.port}", token("a")),
                              capture_output=True, text=True, timeout=60, check=False).stdout


def test_gpupools_cuda_runtime_sets_each_of_the_two_devices(programs: tuple[Programs, Path], tmp_path: Path) -> None:
    """cudaGetDeviceCount 2, cudaSetDevice over both (2 refused: cudaErrorInvalidDevice), the whole
    share allocated on each, cudaMemGetInfo of the device set."""
    out = run_runtime_probe(programs[0], tmp_path, "256")
    assert out == ("count 0 2\n"
                   "set 2: 101\n"
                   f"device 0: set 0 get 0 malloc 0 info 0 free 0 total {256 * MIB}\n"
                   f"device 1: set 0 get 0 malloc 0 info 0 free 0 total {256 * MIB}\n"
                   "one more on device 0: 2\n")


def test_gpupools_cuda_runtime_loads_a_registered_fatbin_on_each_device_it_is_used_on(
        programs: tuple[Programs, Path], tmp_path: Path) -> None:
    """A kernel registered as nvcc registers it runs on device 0 and, after cudaSetDevice(1), on
    device 1 (from device 1's own module: the stand-in, as a real driver, refuses a function of
    device 0's context there with 400), a registered variable is copied to and read back on each
    device and is two globals, the kernel runs on device 0 again; cudaDeviceReset of device 1 leaves
    device 0's memory and module, and device 1 loads its module again at its next use."""
    out = run_runtime_probe(programs[0], tmp_path, "kernels")
    assert out == ("device 0: add 0 ok 1 table 1 attributes 0 regs 32\n"
                   "device 1: add 0 ok 1 table 1 attributes 0 regs 32\n"
                   "tables distinct 1\n"
                   "device 0 again: add 0 ok 1 table kept 1\n"
                   "reset device 1: 0; device 0 after: add 0 ok 1 table kept 1\n"
                   "device 1 after: add 0 ok 1 table 1\n")


def test_pointer_attributes_name_the_device_of_the_allocation(programs: tuple[Programs, Path],
                                                              tmp_path: Path) -> None:
    """cudaPointerGetAttributes with device 0 current: device 1's cudaMalloc memory and a registered
    variable's address on device 1 are device memory (2) of device 1, cudaMallocHost memory made
    while device 1 was current is host memory (1) of device 1 (NVIDIA's rule: the device current at
    its allocation), not the current device's."""
    out = run_runtime_probe(programs[0], tmp_path, "pointers")
    assert out == "pointers device1 0 2 1 host1 0 1 1 variable1 0 2 1\n"
