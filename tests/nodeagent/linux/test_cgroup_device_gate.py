"""The cgroup-device gate on the real kernel: real child processes in a real cgroup2 directory open
a stand-in character device node (``mknod`` of 1:3, /dev/null's number, and 1:5, /dev/zero's).

Skipped, with the probe's reason, where the kernel or the privileges do not allow device programs;
on the project's test machines (root, kernel 6.18) they run.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from gpupool.nodeagent.linux import bpf_devices_program as program
from gpupool.nodeagent.linux import bpf_syscall as sys_bpf
from gpupool.nodeagent.linux.cgroup2 import cgroup2_mount
from gpupool.nodeagent.linux.cgroup_device_gate import (
    CgroupDeviceGate,
    DeviceNumber,
    GateError,
    cgroup_device_gate_available,
    load_program,
)

AVAILABLE, WHY = cgroup_device_gate_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"cgroup-device gate unavailable: {WHY}")

NULL, ZERO = DeviceNumber(1, 3), DeviceNumber(1, 5)
V1_DEVICES = "/sys/fs/cgroup/devices"
TIMEOUT = 10.0

_OPENER = (
    "import os, sys\n"
    "print('ready', flush=True)\n"
    "for line in sys.stdin:\n"
    "    path, mode = line.split()\n"
    "    try:\n"
    "        if mode == 'm':\n"
    "            os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))\n"
    "        else:\n"
    "            os.close(os.open(path, os.O_WRONLY if mode == 'w' else os.O_RDONLY))\n"
    "        print(0, flush=True)\n"
    "    except OSError as exc:\n"
    "        print(exc.errno, flush=True)\n"
)


class Opener:
    """A child process, optionally moved into cgroups before it opens anything, that opens a path
    on request and answers with the errno (0: opened)."""

    def __init__(self, *cgroup_dirs: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _OPENER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        for directory in cgroup_dirs:
            with open(os.path.join(directory, "cgroup.procs"), "w", encoding="ascii") as fh:
                fh.write(str(self.process.pid))
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def open(self, path: str, mode: str = "r") -> int:
        """The errno of opening ``path`` for reading (``r``) or writing (``w``), or of creating a
        node of 1:3 there (``m``), in the child."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{path} {mode}\n")
        self.process.stdin.flush()
        return int(self._line())

    def end(self) -> None:
        """Let the child exit and reap it (its cgroup can then be removed)."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(TIMEOUT)


def _make_cgroup(parent: str) -> Iterator[str]:
    path = os.path.join(parent, f"gpupool-test-{uuid.uuid4().hex[:12]}")
    os.mkdir(path)
    try:
        yield path
    finally:
        for child in sorted((d for d, _, _ in os.walk(path)), key=len, reverse=True):
            os.rmdir(child)


@pytest.fixture
def cgroup() -> Iterator[str]:
    """A fresh cgroup2 directory standing for a container's, removed afterwards."""
    mount = cgroup2_mount()
    assert mount is not None
    yield from _make_cgroup(mount)


@pytest.fixture
def devices(tmp_path: os.PathLike[str]) -> dict[DeviceNumber, str]:
    """Stand-in character device nodes ``nvidia0`` (1:3) and ``nvidia1`` (1:5) in a temporary dir."""
    nodes = {}
    for name, number in (("nvidia0", NULL), ("nvidia1", ZERO)):
        path = os.path.join(str(tmp_path), name)
        os.mknod(path, 0o666 | 0o020000, os.makedev(number.major, number.minor))
        nodes[number] = path
    return nodes


@pytest.fixture
def gate() -> Iterator[CgroupDeviceGate]:
    with CgroupDeviceGate() as opened:
        yield opened


def _attached_programs(cgroup_dir: str) -> tuple[int, ...]:
    fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return sys_bpf.Bpf().prog_query(fd, sys_bpf.BPF_CGROUP_DEVICE).program_ids
    finally:
        os.close(fd)


def test_a_denied_device_fails_to_open_in_the_cgroup_only_until_allowed(
        gate: CgroupDeviceGate, cgroup: str, devices: dict[DeviceNumber, str]) -> None:
    inside, outside = Opener(cgroup), Opener()
    try:
        assert inside.open(devices[NULL]) == 0
        gate.deny(cgroup, devices[NULL])
        assert inside.open(devices[NULL]) == errno.EPERM
        assert inside.open(devices[NULL], "w") == errno.EPERM
        assert inside.open(devices[ZERO]) == 0, "another device stays open to the container"
        assert outside.open(devices[NULL]) == 0, "a process outside the cgroup is not affected"
        assert inside.open(devices[NULL] + ".node", "m") == 0, "creating a node is not using it"
        gate.allow(cgroup, devices[NULL])
        assert inside.open(devices[NULL]) == 0
    finally:
        inside.end()
        outside.end()


def test_sub_cgroups_and_cgroup_paths_as_proc_writes_them(
        gate: CgroupDeviceGate, cgroup: str, devices: dict[DeviceNumber, str]) -> None:
    nested = os.path.join(cgroup, "inner")
    os.mkdir(nested)
    child = Opener(nested)
    try:
        mount = cgroup2_mount()
        assert mount is not None
        as_in_proc = "/" + os.path.relpath(cgroup, mount)  # the 0:: line's form
        gate.deny(as_in_proc, NULL)
        assert child.open(devices[NULL]) == errno.EPERM
        assert gate.denied() == {cgroup: frozenset({NULL})}
    finally:
        child.end()


def test_deny_and_allow_are_idempotent_and_the_program_leaves_with_the_last_deny(
        gate: CgroupDeviceGate, cgroup: str, devices: dict[DeviceNumber, str]) -> None:
    gate.allow(cgroup, NULL)  # never denied: nothing happens
    assert _attached_programs(cgroup) == ()
    gate.deny(cgroup, NULL)
    gate.deny(cgroup, devices[NULL])
    gate.deny(cgroup, ZERO)
    assert len(_attached_programs(cgroup)) == 1, "one program per cgroup, however many denies"
    gate.allow(cgroup, NULL)
    gate.allow(cgroup, NULL)
    assert len(_attached_programs(cgroup)) == 1
    gate.allow(cgroup, ZERO)
    assert _attached_programs(cgroup) == ()
    assert gate.denied() == {}


def test_close_detaches_everything_and_refuses_further_denies(
        cgroup: str, devices: dict[DeviceNumber, str]) -> None:
    gate = CgroupDeviceGate()
    gate.deny(cgroup, NULL)
    child = Opener(cgroup)
    try:
        assert child.open(devices[NULL]) == errno.EPERM
        gate.close()
        gate.close()
        assert child.open(devices[NULL]) == 0
        assert _attached_programs(cgroup) == ()
        with pytest.raises(GateError, match="closed"):
            gate.deny(cgroup, NULL)
    finally:
        child.end()


def test_the_gate_never_widens_another_device_program(
        gate: CgroupDeviceGate, cgroup: str, devices: dict[DeviceNumber, str]) -> None:
    """A container runtime's own program (here: one that refuses 1:5) keeps refusing whatever the
    gate allows: every attached program must allow."""
    bpf = sys_bpf.Bpf()
    runtime_map = bpf.map_create(sys_bpf.BPF_MAP_TYPE_HASH, 8, 4, 4, "runtime")
    bpf.map_update(runtime_map, program.deny_key(ZERO.major, ZERO.minor), program.DENY_VALUE.pack(1))
    runtime_prog = load_program(bpf, runtime_map)
    dir_fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    bpf.prog_attach(dir_fd, runtime_prog, sys_bpf.BPF_CGROUP_DEVICE, sys_bpf.BPF_F_ALLOW_MULTI)
    child = Opener(cgroup)
    try:
        gate.deny(cgroup, NULL)
        assert (child.open(devices[NULL]), child.open(devices[ZERO])) == (errno.EPERM, errno.EPERM)
        gate.allow(cgroup, NULL)
        gate.allow(cgroup, ZERO)
        assert (child.open(devices[NULL]), child.open(devices[ZERO])) == (0, errno.EPERM)
    finally:
        child.end()
        bpf.prog_detach(dir_fd, runtime_prog, sys_bpf.BPF_CGROUP_DEVICE)
        for fd in (dir_fd, runtime_prog, runtime_map):
            os.close(fd)


@pytest.fixture
def v1_devices_cgroup() -> Iterator[str]:
    """A child of the cgroup v1 ``devices`` controller (hybrid hosts: where containers' device
    rules live next to the v2 hierarchy the gate attaches to)."""
    if not os.path.isfile(os.path.join(V1_DEVICES, "devices.allow")):
        pytest.skip(f"no cgroup v1 devices controller at {V1_DEVICES}")
    yield from _make_cgroup(V1_DEVICES)


def test_with_the_v1_devices_controller_both_rule_sets_apply(
        gate: CgroupDeviceGate, cgroup: str, v1_devices_cgroup: str,
        devices: dict[DeviceNumber, str]) -> None:
    with open(os.path.join(v1_devices_cgroup, "devices.deny"), "w", encoding="ascii") as fh:
        fh.write(f"c {ZERO} rwm")
    child = Opener(cgroup, v1_devices_cgroup)
    try:
        assert (child.open(devices[NULL]), child.open(devices[ZERO])) == (0, errno.EPERM)
        gate.deny(cgroup, NULL)
        assert child.open(devices[NULL]) == errno.EPERM, "the v2 program is enforced beside v1"
        gate.allow(cgroup, NULL)
        assert (child.open(devices[NULL]), child.open(devices[ZERO])) == (0, errno.EPERM)
    finally:
        child.end()


_DYING_AGENT = (
    "import sys\n"
    "from gpupool.nodeagent.linux.cgroup_device_gate import CgroupDeviceGate, DeviceNumber\n"
    "gate = CgroupDeviceGate()\n"
    "gate.deny(sys.argv[1], DeviceNumber(1, 3))\n"
    "print('denied', flush=True)\n"
    "sys.stdin.readline()\n"
)


def test_a_killed_agent_leaves_nothing_denied(cgroup: str, devices: dict[DeviceNumber, str]) -> None:
    agent = subprocess.Popen([sys.executable, "-c", _DYING_AGENT, cgroup], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    child = Opener(cgroup)
    try:
        assert agent.stdout is not None and agent.stdout.readline().strip() == "denied"
        assert child.open(devices[NULL]) == errno.EPERM
        agent.send_signal(signal.SIGKILL)
        agent.wait(TIMEOUT)
        assert child.open(devices[NULL]) == 0
        assert _attached_programs(cgroup) == ()
    finally:
        agent.kill()
        agent.wait(TIMEOUT)
        child.end()


def test_clear_errors(gate: CgroupDeviceGate, cgroup: str, tmp_path: os.PathLike[str]) -> None:
    regular = os.path.join(str(tmp_path), "plain")
    open(regular, "w", encoding="ascii").close()
    with pytest.raises(GateError, match="not a character device"):
        gate.deny(cgroup, regular)
    with pytest.raises(GateError, match="has the container exited"):
        gate.deny(os.path.join(cgroup, "gone"), NULL)
    with pytest.raises(GateError, match="outside the cgroup2 hierarchy"):
        gate.deny("/../../tmp", NULL)
    gate.allow(os.path.join(cgroup, "gone"), NULL)  # nothing to undo: no error


def test_a_refused_program_reports_the_verifier_log(tmp_path: os.PathLike[str]) -> None:
    not_a_map = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(GateError, match=r"(?s)refuses the cgroup-device program.*verifier log:\n.+"):
            load_program(sys_bpf.Bpf(), not_a_map)
    finally:
        os.close(not_a_map)


_UNPRIVILEGED_PROBE = (
    "import os\n"
    "from gpupool.nodeagent.linux.cgroup_device_gate import cgroup_device_gate_available\n"
    "os.setgroups([]); os.setgid(65534); os.setuid(65534)  # after the imports: nobody cannot read them\n"
    "print(cgroup_device_gate_available())\n"
)


def test_without_privileges_the_probe_says_what_is_missing() -> None:
    out = subprocess.run([sys.executable, "-c", _UNPRIVILEGED_PROBE], capture_output=True, text=True,
                         timeout=TIMEOUT, check=True)
    assert out.stdout.startswith("(False, ") and "CAP_BPF" in out.stdout, out.stdout + out.stderr
