"""Refuse a container's opens of chosen GPU devices: the allow/deny answer on kernels where
fanotify cannot hold a device open.

The kernel asks the cgroup-device BPF programs attached to a process's cgroup v2 directory on every
open of a device node, and its answer is final (``EPERM``), before the driver sees the open. The
gate attaches one small program (``bpf_devices_program``) with its own deny map to each container
cgroup it is asked to narrow, the first time a device is denied there, and detaches it when the
last denied device of that cgroup is allowed again. The answer is precomputed: a program cannot
wait for user space, so the lending rules call :meth:`CgroupDeviceGate.deny` before the open, not
in reply to it.

Safety:
- the program only denies (see its module): runc's own device rules (a v2 program, or the v1
  ``devices`` controller, which the kernel checks as well) still apply, nothing is widened;
- attachments are BPF links held by this process: if the agent dies, the kernel detaches them and
  every device is allowed again (a crashed agent must not lock GPUs away). Kernels before 5.7 have
  no cgroup links; there the gate attaches with ``BPF_PROG_ATTACH`` + ``BPF_F_ALLOW_MULTI``, which
  survives the agent until :meth:`close` or the cgroup's removal.

Usage (thread-safe, idempotent)::

    gate = CgroupDeviceGate()                      # raises GateError when unusable
    gate.deny("/k8s.io/<container id>", "/dev/nvidia0")   # or DeviceNumber(195, 0)
    gate.allow("/k8s.io/<container id>", "/dev/nvidia0")
    gate.close()                                   # on agent exit: detach everything
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from dataclasses import dataclass, field

from gpupool.nodeagent.linux import bpf_devices_program as program
from gpupool.nodeagent.linux import bpf_syscall as sys_bpf
from gpupool.nodeagent.linux.cgroup2 import (
    Cgroup2Error,
    cgroup2_directory,
    cgroup2_join,
    cgroup2_mount,
    cgroup2_path_of_pid,
)

log = logging.getLogger(__name__)

PROGRAM_NAME = "gpupool_devgate"
MAP_NAME = "gpupool_deny"
_DENIED = program.DENY_VALUE.pack(1)


class GateError(RuntimeError):
    """The gate cannot do what was asked; the message says why (capability, cgroup2, verifier)."""


@dataclass(frozen=True, order=True)
class DeviceNumber:
    """A character device's number, as ``stat`` reports it in ``st_rdev``."""

    major: int
    minor: int

    @classmethod
    def of(cls, device: DeviceNumber | str) -> DeviceNumber:
        """``device`` itself, or the number of the character device node at that path."""
        if isinstance(device, DeviceNumber):
            return device
        try:
            info = os.stat(device)
        except OSError as exc:
            raise GateError(f"cannot stat device {device}: {exc.strerror}") from None
        if not stat.S_ISCHR(info.st_mode):
            raise GateError(f"{device} is not a character device")
        return cls(os.major(info.st_rdev), os.minor(info.st_rdev))

    def __str__(self) -> str:
        return f"{self.major}:{self.minor}"


@dataclass
class _Attached:
    """One container cgroup the gate narrows: its directory fd, program, map and attachment."""

    directory: str
    dir_fd: int
    map_fd: int
    prog_fd: int
    link_fd: int | None  # None: attached with BPF_PROG_ATTACH (no cgroup links on this kernel)
    denied: set[DeviceNumber] = field(default_factory=set)


def _capability_hint(exc: sys_bpf.BpfError) -> str:
    if exc.errno == errno.EPERM:
        return " (needs CAP_BPF and CAP_SYS_ADMIN, or root)"
    return ""


class CgroupDeviceGate:
    """Deny and allow opens of character devices per container cgroup (cgroup v2 device programs)."""

    def __init__(self, mount: str | None = None, bpf: sys_bpf.Bpf | None = None) -> None:
        found = mount if mount is not None else cgroup2_mount()
        if found is None:
            raise GateError("no cgroup2 hierarchy is mounted (device programs attach to cgroup v2 only)")
        self.mount = found
        try:
            self._bpf = bpf if bpf is not None else sys_bpf.Bpf()
        except sys_bpf.BpfError as exc:
            raise GateError(str(exc)) from None
        self._lock = threading.Lock()
        self._attached: dict[str, _Attached] = {}
        self._closed = False

    def deny(self, cgroup: str, device: DeviceNumber | str) -> None:
        """From now on, processes of ``cgroup`` (and its sub-cgroups) fail to open ``device`` with
        ``EPERM``; files they hold already stay open. ``cgroup``: its directory under the cgroup2
        mount, or its path as ``/proc/<pid>/cgroup`` writes it. Denying twice is a no-op."""
        number = DeviceNumber.of(device)
        with self._lock:
            self._check_open()
            attached = self._attached_for(cgroup)
            if number in attached.denied:
                return
            try:
                self._bpf.map_update(attached.map_fd, program.deny_key(number.major, number.minor), _DENIED)
            except sys_bpf.BpfError as exc:
                raise GateError(f"cannot deny {number} to {attached.directory}: {exc.strerror}") from None
            attached.denied.add(number)
            log.info("device gate: %s denied to cgroup %s", number, attached.directory)

    def allow(self, cgroup: str, device: DeviceNumber | str) -> None:
        """Undo :meth:`deny`; allowing what was never denied (or a vanished cgroup) is a no-op.
        The cgroup's program is detached once nothing is denied there."""
        number = DeviceNumber.of(device)
        with self._lock:
            self._check_open()
            attached = self._find(cgroup)
            if attached is None or number not in attached.denied:
                return
            try:
                self._bpf.map_delete(attached.map_fd, program.deny_key(number.major, number.minor))
            except sys_bpf.BpfError as exc:
                raise GateError(f"cannot allow {number} to {attached.directory}: {exc.strerror}") from None
            attached.denied.discard(number)
            log.info("device gate: %s allowed again to cgroup %s", number, attached.directory)
            if not attached.denied:
                self._detach(attached)
                del self._attached[attached.directory]

    def denied(self) -> dict[str, frozenset[DeviceNumber]]:
        """Per cgroup directory, the devices denied there now."""
        with self._lock:
            return {path: frozenset(a.denied) for path, a in self._attached.items()}

    def close(self) -> None:
        """Detach every program (agent exit); calling it again is a no-op."""
        with self._lock:
            for attached in self._attached.values():
                self._detach(attached)
            self._attached.clear()
            self._closed = True

    def __enter__(self) -> CgroupDeviceGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise GateError("the device gate is closed")

    def _find(self, cgroup: str) -> _Attached | None:
        try:
            return self._attached.get(cgroup2_join(cgroup, self.mount))
        except Cgroup2Error:
            return None

    def _attached_for(self, cgroup: str) -> _Attached:
        try:
            directory = cgroup2_directory(cgroup, self.mount)
        except Cgroup2Error as exc:
            raise GateError(str(exc)) from None
        if directory in self._attached:
            return self._attached[directory]
        attached = self._attach(directory)
        self._attached[directory] = attached
        return attached

    def _attach(self, directory: str) -> _Attached:
        try:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise GateError(f"cannot open cgroup {directory}: {exc.strerror}") from None
        map_fd = prog_fd = -1
        try:
            map_fd = self._bpf.map_create(sys_bpf.BPF_MAP_TYPE_HASH, program.DENY_KEY.size,
                                          program.DENY_VALUE.size, program.DENY_MAP_MAX_ENTRIES, MAP_NAME)
            prog_fd = load_program(self._bpf, map_fd)
            link_fd = _link(self._bpf, dir_fd, prog_fd, directory)
        except (sys_bpf.BpfError, GateError) as exc:
            for fd in (prog_fd, map_fd, dir_fd):
                if fd >= 0:
                    os.close(fd)
            if isinstance(exc, GateError):
                raise
            raise GateError(f"cannot set up the device program for {directory}: {exc.strerror}"
                            f"{_capability_hint(exc)}") from None
        return _Attached(directory, dir_fd, map_fd, prog_fd, link_fd)

    def _detach(self, attached: _Attached) -> None:
        if attached.link_fd is not None:
            os.close(attached.link_fd)
        else:
            try:
                self._bpf.prog_detach(attached.dir_fd, attached.prog_fd, sys_bpf.BPF_CGROUP_DEVICE)
            except sys_bpf.BpfError as exc:  # the cgroup was removed: nothing left attached
                log.info("device gate: detach from %s: %s", attached.directory, exc.strerror)
        for fd in (attached.prog_fd, attached.map_fd, attached.dir_fd):
            os.close(fd)


def _link(bpf: sys_bpf.Bpf, dir_fd: int, prog_fd: int, directory: str) -> int | None:
    """Attach through a BPF link (returned); ``None`` when attached with ``BPF_PROG_ATTACH``."""
    try:
        return bpf.link_create(dir_fd, prog_fd, sys_bpf.BPF_CGROUP_DEVICE)
    except sys_bpf.BpfError as exc:
        if exc.errno != errno.EINVAL:
            raise GateError(f"cannot attach the device program to {directory}: {exc.strerror}"
                            f"{_attach_hint(exc)}") from None
    try:  # kernels before 5.7: no cgroup links
        bpf.prog_attach(dir_fd, prog_fd, sys_bpf.BPF_CGROUP_DEVICE, sys_bpf.BPF_F_ALLOW_MULTI)
    except sys_bpf.BpfError as exc:
        raise GateError(f"cannot attach the device program to {directory}: {exc.strerror}"
                        f"{_attach_hint(exc)}") from None
    return None


def _attach_hint(exc: sys_bpf.BpfError) -> str:
    if exc.errno == errno.EPERM:
        return " (an ancestor cgroup holds a device program attached without BPF_F_ALLOW_MULTI, " \
               "or CAP_SYS_ADMIN is missing)"
    return ""


def load_program(bpf: sys_bpf.Bpf, map_fd: int) -> int:
    """Load the device program over ``map_fd``; a refusal raises :class:`GateError` with the
    verifier's log."""
    try:
        return bpf.prog_load(sys_bpf.BPF_PROG_TYPE_CGROUP_DEVICE, program.build(map_fd), PROGRAM_NAME,
                             expected_attach_type=sys_bpf.BPF_CGROUP_DEVICE)
    except sys_bpf.BpfError as exc:
        detail = f"; verifier log:\n{exc.verifier_log}" if exc.verifier_log else ""
        raise GateError(f"the kernel refuses the cgroup-device program: {exc.strerror}"
                        f"{_capability_hint(exc)}{detail}") from None


def cgroup_device_gate_available(mount: str | None = None) -> tuple[bool, str]:
    """Whether the gate works here, and why (or why not): a cgroup2 mount, the program loads, and
    it attaches to this process's own cgroup (with an empty deny map: it allows everything)."""
    try:
        gate = CgroupDeviceGate(mount)
        bpf = sys_bpf.Bpf()
    except (GateError, sys_bpf.BpfError) as exc:
        return False, str(exc)
    fds: list[int] = []
    try:
        fds.append(bpf.map_create(sys_bpf.BPF_MAP_TYPE_HASH, program.DENY_KEY.size, program.DENY_VALUE.size,
                                  program.DENY_MAP_MAX_ENTRIES, MAP_NAME))
        fds.append(load_program(bpf, fds[0]))
        own = cgroup2_directory(cgroup2_path_of_pid(os.getpid()), gate.mount)
        fds.append(os.open(own, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        link = _link(bpf, fds[2], fds[1], own)
        if link is None:
            bpf.prog_detach(fds[2], fds[1], sys_bpf.BPF_CGROUP_DEVICE)
        else:
            os.close(link)
    except sys_bpf.BpfError as exc:
        return False, f"cgroup-device BPF unavailable: {exc.strerror}{_capability_hint(exc)}"
    except (GateError, Cgroup2Error) as exc:
        return False, str(exc)
    finally:
        for fd in reversed(fds):
            os.close(fd)
    return True, f"cgroup-device BPF program on cgroup2 at {gate.mount} (kernel {os.uname().release}): " \
                 "opens of denied devices fail with EPERM"
