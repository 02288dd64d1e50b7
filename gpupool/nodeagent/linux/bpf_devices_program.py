"""The cgroup-device BPF program: deny opens of the character devices listed in its map.

The kernel runs every ``BPF_PROG_TYPE_CGROUP_DEVICE`` program attached to a process's cgroup v2
directory (and its ancestors) on each device access check: ``open()`` of a device node and
``mknod()``. The context is ``struct bpf_cgroup_dev_ctx``: ``access_type`` (device type in the low
16 bits, access bits in the high 16), ``major``, ``minor``. A return of 0 fails the access with
``EPERM``; 1 lets the other checks decide. With several programs attached (``BPF_F_ALLOW_MULTI`` or
links, as runc's own device program) every one must return 1, so this program only ever narrows
what the container may open: it returns 0 for a read or write of a character device whose
(major, minor) is a key of its deny map, and 1 for everything else (block devices, ``mknod``, any
device not listed) - it never widens runc's device rules.

``mknod`` is not refused: the gate is about using a GPU, and refusing to create a node could break
a container's start-up.
"""

from __future__ import annotations

import struct

from gpupool.nodeagent.linux.bpf_asm import R0, R1, R2, R6, R10, SIZE_W, Program

DEV_TYPE_BLOCK = 1  # BPF_DEVCG_DEV_BLOCK
DEV_TYPE_CHAR = 2  # BPF_DEVCG_DEV_CHAR
ACCESS_MKNOD = 1  # BPF_DEVCG_ACC_MKNOD
ACCESS_READ = 2
ACCESS_WRITE = 4

HELPER_MAP_LOOKUP_ELEM = 1

# struct bpf_cgroup_dev_ctx
_CTX_ACCESS_TYPE, _CTX_MAJOR, _CTX_MINOR = 0, 4, 8
_TYPE_MASK = 0xFFFF
_ACCESS_SHIFT = 16

DENY_KEY = struct.Struct("=II")  # major, minor: the map's key
DENY_VALUE = struct.Struct("=I")  # unused by the program; 1 for "denied"
DENY_MAP_MAX_ENTRIES = 256

VERDICT_DENY = 0
VERDICT_ALLOW = 1

_KEY_ON_STACK = -DENY_KEY.size


def deny_key(major: int, minor: int) -> bytes:
    """The deny map's key for device ``major:minor``."""
    return DENY_KEY.pack(major, minor)


def build(deny_map_fd: int) -> bytes:
    """The program's bytecode, reading the deny map ``deny_map_fd`` (a hash map of
    :data:`DENY_KEY` to :data:`DENY_VALUE`)."""
    p = Program()
    p.mov_reg(R6, R1)  # keep ctx: r1 is clobbered by the helper call
    p.load(SIZE_W, R1, R6, _CTX_ACCESS_TYPE)
    p.mov_reg(R2, R1)
    p.and_imm(R2, _TYPE_MASK)
    p.jne_imm(R2, DEV_TYPE_CHAR, "allow")
    p.rsh_imm(R1, _ACCESS_SHIFT)
    p.jset_imm(R1, ACCESS_READ | ACCESS_WRITE, "look_up")
    p.jump("allow")
    p.label("look_up")
    p.load(SIZE_W, R1, R6, _CTX_MAJOR)
    p.store_reg(SIZE_W, R10, _KEY_ON_STACK, R1)
    p.load(SIZE_W, R1, R6, _CTX_MINOR)
    p.store_reg(SIZE_W, R10, _KEY_ON_STACK + 4, R1)
    p.load_map_fd(R1, deny_map_fd)
    p.mov_reg(R2, R10)
    p.add_imm(R2, _KEY_ON_STACK)
    p.call(HELPER_MAP_LOOKUP_ELEM)
    p.jeq_imm(R0, 0, "allow")
    p.mov_imm(R0, VERDICT_DENY)
    p.exit()
    p.label("allow")
    p.mov_imm(R0, VERDICT_ALLOW)
    p.exit()
    return p.encode()
