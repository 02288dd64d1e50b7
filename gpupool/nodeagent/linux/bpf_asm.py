"""A minimal eBPF assembler: the handful of instructions the device program uses, with labels.

No clang or libbpf is needed on a node: the program is a few dozen instructions, encoded here as
the kernel reads them (``struct bpf_insn``: opcode byte, destination and source register nibbles,
signed 16-bit offset, signed 32-bit immediate; ``Documentation/bpf/standardization``). Jumps name
a label; :meth:`Program.encode` resolves it to the instruction offset the verifier expects.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)

# opcode = operation | source | class
_CLASS_LDX, _CLASS_ST, _CLASS_STX, _CLASS_JMP, _CLASS_ALU64 = 0x01, 0x02, 0x03, 0x05, 0x07
_SRC_IMM, _SRC_REG = 0x00, 0x08
_MODE_MEM = 0x60
SIZE_W, SIZE_DW = 0x00, 0x18  # 4 and 8 bytes
_ALU_ADD, _ALU_AND, _ALU_RSH, _ALU_MOV = 0x00, 0x50, 0x70, 0xB0
_JMP_JA, _JMP_JEQ, _JMP_JNE, _JMP_JSET = 0x00, 0x10, 0x50, 0x40
_JMP_CALL, _JMP_EXIT = 0x80, 0x90
_LD_IMM64 = 0x18
PSEUDO_MAP_FD = 1  # src_reg of a 64-bit immediate load whose immediate is a map fd

_INSN = struct.Struct("<BBhi")


@dataclass(frozen=True)
class Insn:
    """One instruction slot; ``target`` names the label a jump goes to (its offset filled at encode)."""

    opcode: int
    dst: int = 0
    src: int = 0
    offset: int = 0
    imm: int = 0
    target: str | None = None


@dataclass
class Program:
    """Instructions appended in order; ``label(name)`` marks the next instruction as a jump target."""

    insns: list[Insn] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)

    def label(self, name: str) -> None:
        """The next instruction is ``name``."""
        if name in self.labels:
            raise ValueError(f"label {name!r} defined twice")
        self.labels[name] = len(self.insns)

    def mov_imm(self, dst: int, imm: int) -> None:
        """``dst = imm`` (64-bit, sign-extended)."""
        self.insns.append(Insn(_CLASS_ALU64 | _ALU_MOV | _SRC_IMM, dst, 0, 0, imm))

    def mov_reg(self, dst: int, src: int) -> None:
        """``dst = src``."""
        self.insns.append(Insn(_CLASS_ALU64 | _ALU_MOV | _SRC_REG, dst, src))

    def add_imm(self, dst: int, imm: int) -> None:
        """``dst += imm``."""
        self.insns.append(Insn(_CLASS_ALU64 | _ALU_ADD | _SRC_IMM, dst, 0, 0, imm))

    def and_imm(self, dst: int, imm: int) -> None:
        """``dst &= imm``."""
        self.insns.append(Insn(_CLASS_ALU64 | _ALU_AND | _SRC_IMM, dst, 0, 0, imm))

    def rsh_imm(self, dst: int, imm: int) -> None:
        """``dst >>= imm`` (logical)."""
        self.insns.append(Insn(_CLASS_ALU64 | _ALU_RSH | _SRC_IMM, dst, 0, 0, imm))

    def load(self, size: int, dst: int, src: int, offset: int) -> None:
        """``dst = *(size *)(src + offset)``."""
        self.insns.append(Insn(_CLASS_LDX | _MODE_MEM | size, dst, src, offset))

    def store_reg(self, size: int, dst: int, offset: int, src: int) -> None:
        """``*(size *)(dst + offset) = src``."""
        self.insns.append(Insn(_CLASS_STX | _MODE_MEM | size, dst, src, offset))

    def store_imm(self, size: int, dst: int, offset: int, imm: int) -> None:
        """``*(size *)(dst + offset) = imm``."""
        self.insns.append(Insn(_CLASS_ST | _MODE_MEM | size, dst, 0, offset, imm))

    def load_map_fd(self, dst: int, map_fd: int) -> None:
        """``dst = map`` (two slots; the verifier turns the fd into the map's address)."""
        self.insns.append(Insn(_LD_IMM64, dst, PSEUDO_MAP_FD, 0, map_fd))
        self.insns.append(Insn(0))

    def jump(self, target: str) -> None:
        """``goto target``."""
        self.insns.append(Insn(_CLASS_JMP | _JMP_JA, target=target))

    def jeq_imm(self, dst: int, imm: int, target: str) -> None:
        """``if dst == imm goto target``."""
        self.insns.append(Insn(_CLASS_JMP | _JMP_JEQ | _SRC_IMM, dst, 0, 0, imm, target))

    def jne_imm(self, dst: int, imm: int, target: str) -> None:
        """``if dst != imm goto target``."""
        self.insns.append(Insn(_CLASS_JMP | _JMP_JNE | _SRC_IMM, dst, 0, 0, imm, target))

    def jset_imm(self, dst: int, imm: int, target: str) -> None:
        """``if dst & imm goto target``."""
        self.insns.append(Insn(_CLASS_JMP | _JMP_JSET | _SRC_IMM, dst, 0, 0, imm, target))

    def call(self, helper: int) -> None:
        """Call kernel helper number ``helper`` (arguments in r1-r5, result in r0)."""
        self.insns.append(Insn(_CLASS_JMP | _JMP_CALL, imm=helper))

    def exit(self) -> None:
        """Return r0."""
        self.insns.append(Insn(_CLASS_JMP | _JMP_EXIT))

    def encode(self) -> bytes:
        """The bytes ``BPF_PROG_LOAD`` takes; an unknown label raises ``ValueError``."""
        out = bytearray()
        for index, insn in enumerate(self.insns):
            offset = insn.offset
            if insn.target is not None:
                if insn.target not in self.labels:
                    raise ValueError(f"jump to undefined label {insn.target!r}")
                offset = self.labels[insn.target] - index - 1
            out += _INSN.pack(insn.opcode, (insn.src << 4) | insn.dst, offset, insn.imm)
        return bytes(out)
