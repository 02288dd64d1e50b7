"""The gate's pure parts: the assembler's encoding, cgroup2 paths, device numbers, the selector's
start-up report. No privileges needed."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

import pytest

from gpupool.nodeagent.linux import bpf_devices_program as program
from gpupool.nodeagent.linux.bpf_asm import R0, R1, R2, R10, SIZE_DW, SIZE_W, Program
from gpupool.nodeagent.linux.cgroup2 import (
    Cgroup2Error,
    cgroup2_directory,
    cgroup2_join,
    cgroup2_mount,
    cgroup2_path_of_pid,
)
from gpupool.nodeagent.linux.cgroup_device_gate import DeviceNumber, GateError
from gpupool.nodeagent.monitor.source_selector import choose_source
from tests.nodeagent.monitor.children import stand_in


@pytest.mark.parametrize("emit, expected", [
    pytest.param(lambda p: p.mov_imm(R0, 1), "b700000001000000", id="r0 = 1"),
    pytest.param(lambda p: p.mov_reg(R2, R10), "bfa2000000000000", id="r2 = r10"),
    pytest.param(lambda p: p.add_imm(R2, -8), "07020000f8ffffff", id="r2 += -8"),
    pytest.param(lambda p: p.load(SIZE_W, R1, R2, 4), "6121040000000000", id="r1 = *(u32 *)(r2 + 4)"),
    pytest.param(lambda p: p.store_reg(SIZE_W, R10, -8, R1), "631af8ff00000000", id="*(u32 *)(r10 - 8) = r1"),
    pytest.param(lambda p: p.store_imm(SIZE_DW, R10, -8, 0), "7a0af8ff00000000", id="*(u64 *)(r10 - 8) = 0"),
    pytest.param(lambda p: p.load_map_fd(R1, 7), "1811000007000000" + "00" * 8, id="r1 = map fd 7"),
    pytest.param(lambda p: p.call(1), "8500000001000000", id="call map_lookup_elem"),
    pytest.param(lambda p: p.exit(), "9500000000000000", id="exit"),
])
def test_instructions_encode_as_the_kernel_reads_them(emit: Callable[[Program], None], expected: str) -> None:
    p = Program()
    emit(p)
    assert p.encode().hex() == expected


def test_jumps_resolve_labels_forward_and_backward() -> None:
    p = Program()
    p.label("top")
    p.jeq_imm(R0, 0, "end")   # slot 0 -> slot 3: offset 2
    p.mov_imm(R0, 1)
    p.jump("top")             # slot 2 -> slot 0: offset -3
    p.label("end")
    p.exit()
    offsets = [struct.unpack_from("<h", p.encode(), 8 * i + 2)[0] for i in range(4)]
    assert offsets == [2, 0, -3, 0]


def test_bad_labels_are_refused() -> None:
    p = Program()
    p.jump("nowhere")
    with pytest.raises(ValueError, match="undefined label 'nowhere'"):
        p.encode()
    p.label("x")
    with pytest.raises(ValueError, match="defined twice"):
        p.label("x")


def test_the_device_program_ends_both_ways_and_names_its_map() -> None:
    code = program.build(deny_map_fd=42)
    assert len(code) % 8 == 0
    assert code[-32:] == bytes.fromhex("b700000000000000" "9500000000000000"  # deny: r0 = 0; exit
                                       "b700000001000000" "9500000000000000")  # allow: r0 = 1; exit
    assert bytes.fromhex("181100002a000000") in code
    assert program.deny_key(195, 255) == struct.pack("=II", 195, 255)


def test_the_cgroup2_mount_is_read_from_mountinfo(tmp_path: os.PathLike[str]) -> None:
    info = os.path.join(str(tmp_path), "mountinfo")
    with open(info, "w", encoding="ascii") as fh:
        fh.write("30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
                 "35 25 0:31 / /sys/fs/cgroup/uni\\040fied rw,relatime shared:14 - cgroup2 cgroup2 rw\n")
    assert cgroup2_mount(info) == "/sys/fs/cgroup/uni fied"
    with open(info, "w", encoding="ascii") as fh:
        fh.write("30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n")
    assert cgroup2_mount(info) is None
    assert cgroup2_mount(os.path.join(str(tmp_path), "missing")) is None


@pytest.mark.parametrize("content, expected", [
    pytest.param("4:memory:/x\n0::/k8s.io/abc\n", "/k8s.io/abc", id="hybrid"),
    pytest.param("0::/\n", "/", id="root"),
    pytest.param("0::\n", "/", id="empty-means-root"),
])
def test_a_process_cgroup2_path(tmp_path: os.PathLike[str], content: str, expected: str) -> None:
    os.makedirs(os.path.join(str(tmp_path), "7"))
    with open(os.path.join(str(tmp_path), "7", "cgroup"), "w", encoding="ascii") as fh:
        fh.write(content)
    assert cgroup2_path_of_pid(7, proc=str(tmp_path)) == expected


def test_a_process_without_a_v2_line_or_gone(tmp_path: os.PathLike[str]) -> None:
    os.makedirs(os.path.join(str(tmp_path), "7"))
    with open(os.path.join(str(tmp_path), "7", "cgroup"), "w", encoding="ascii") as fh:
        fh.write("4:memory:/x\n")
    with pytest.raises(Cgroup2Error, match="no cgroup v2 line"):
        cgroup2_path_of_pid(7, proc=str(tmp_path))
    with pytest.raises(Cgroup2Error, match="cannot read"):
        cgroup2_path_of_pid(8, proc=str(tmp_path))


def test_cgroup_paths_join_the_mount_and_stay_inside(tmp_path: os.PathLike[str]) -> None:
    mount = str(tmp_path)
    os.makedirs(os.path.join(mount, "k8s.io", "abc"))
    open(os.path.join(mount, "k8s.io", "abc", "cgroup.procs"), "w", encoding="ascii").close()
    full = os.path.join(mount, "k8s.io", "abc")
    assert cgroup2_join("/k8s.io/abc", mount) == full
    assert cgroup2_join(full, mount) == full
    assert cgroup2_directory("k8s.io/abc", mount) == full
    with pytest.raises(Cgroup2Error, match="outside the cgroup2 hierarchy"):
        cgroup2_join("/k8s.io/../../etc", mount)
    with pytest.raises(Cgroup2Error, match="has the container exited"):
        cgroup2_directory("/k8s.io/gone", mount)


def test_device_numbers(tmp_path: os.PathLike[str]) -> None:
    assert DeviceNumber.of(DeviceNumber(195, 0)) == DeviceNumber(195, 0)
    assert str(DeviceNumber(195, 255)) == "195:255"
    assert DeviceNumber.of("/dev/null") == DeviceNumber(1, 3)
    with pytest.raises(GateError, match="not a character device"):
        DeviceNumber.of(stand_in(str(tmp_path), "nvidia0"))
    with pytest.raises(GateError, match="cannot stat device"):
        DeviceNumber.of(os.path.join(str(tmp_path), "missing"))


def _no_fanotify(paths: object) -> str:
    return "no fanotify in this test"


@pytest.mark.parametrize("gate, expected", [
    pytest.param((True, "cgroup-device BPF program"), "cgroup-device-bpf", id="gate-available"),
    pytest.param((False, "no cgroup2 hierarchy is mounted"), "none", id="gate-unavailable"),
])
def test_the_start_up_report_says_which_device_gate_runs(
        tmp_path: os.PathLike[str], caplog: pytest.LogCaptureFixture, gate: tuple[bool, str],
        expected: str) -> None:
    with caplog.at_level("INFO"):
        choice = choose_source([stand_in(str(tmp_path), "nvidia0")], probe=_no_fanotify,
                               gate_probe=lambda: gate)
    assert (choice.gate_available, choice.gate_reason) == gate
    assert f"device gate (deny opens per container): {expected} ({gate[1]})" in caplog.text
