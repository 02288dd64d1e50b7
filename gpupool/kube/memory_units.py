"""Card memory asked for in units, and the refusal of a count no card could hold.

``<domain>/gpu-mem`` and GPUManager's ``tencent.com/vcuda-memory`` count 256 MiB units per card,
gpushare's ``aliyun.com/gpu-mem`` GiB (or MiB, per deployment). Written in the habit of another
unit, the count asks for a card nobody has: ``gpu-mem: 4096`` (meant as MiB) is 1 TiB, and
``gpu-mem: 4Gi`` is 1 EiB, since Kubernetes keeps an extended resource as a plain integer and the
suffix turns it into 4,294,967,296 units. Such a request is refused with the unit and what to write
(``gpupool.io/gpu-mem counts 256 MiB units: 4096 is 1 TiB; for 4 GiB write 16``) instead of
waiting as a pod that fits nowhere. The line is :data:`UNREALISTIC_CARD_MIB` per card: the bound on
a card's memory (:data:`gpupool.api.limits.MAX_CARD_MEMORY_MIB`, five times today's largest card),
so no card gpupool can describe holds it as a slice (a whole card is ``<domain>/gpu: 1``).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from gpupool.api import names as n
from gpupool.api.limits import MAX_CARD_MEMORY_MIB
from gpupool.api.names import ResourceNames
from gpupool.core.units import MEMORY_UNIT_MIB

UNREALISTIC_CARD_MIB = MAX_CARD_MEMORY_MIB
"""A slice of this much memory (1 TiB) or more on one card is a count in the wrong unit."""
SIZE_UNITS = ("MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")
BYTES_PER_MIB = 1 << 20
EXAMPLE_MIB = 4096
"""The size the hint spells out when the meant one cannot be guessed (4 GiB)."""


def memory_units(names: ResourceNames) -> dict[str, int]:
    """The resources that count card memory per card in units, with the MiB one unit is: gpupool's
    and GPUManager's 256 MiB, gpushare's GiB (or MiB, per deployment). HAMi's ``nvidia.com/gpumem``
    (MiB) is read by :mod:`gpupool.kube.foreign`."""
    return {names.gpu_mem: MEMORY_UNIT_MIB, n.ALIYUN_GPU_MEM: names.gpushare_unit_mib,
            n.TENCENT_VCUDA_MEMORY: MEMORY_UNIT_MIB}


def size_text(mib: int | Fraction) -> str:
    """``mib`` in the largest binary unit that keeps it at least 1: ``1 TiB``, ``1.5 GiB``, ``1 EiB``."""
    value, unit = Fraction(mib), 0
    while value >= 1024 and unit < len(SIZE_UNITS) - 1:
        value, unit = value / 1024, unit + 1
    shown = f"{float(value):.3g}" if value < 1000 else f"{float(value):.0f}"
    return f"{shown} {SIZE_UNITS[unit]}"


def unit_text(unit_mib: int) -> str:
    """How a resource counts: ``MiB``, ``GiB`` or ``256 MiB units``."""
    return {1: "MiB", 1024: "GiB"}.get(unit_mib, f"{size_text(unit_mib)} units")


def _meant_mib(count: int) -> Fraction:
    """The size a count in the wrong unit most likely meant: bytes when it is that large (``4Gi``
    is 4294967296), else MiB (``4096`` for 4 GiB)."""
    return Fraction(count, BYTES_PER_MIB) if count >= BYTES_PER_MIB else Fraction(count)


def unit_problem(found: Mapping[str, int], units: Mapping[str, int]) -> str | None:
    """Why a container's per-card memory count (``found[name]``, ``units[name]`` MiB each) cannot be
    what was meant, naming the unit and what to write; None when it is under 1 TiB."""
    for name, unit_mib in units.items():
        count = found.get(name)
        if count is None or count * unit_mib < UNREALISTIC_CARD_MIB:
            continue
        meant = _meant_mib(count)
        if meant.denominator != 1 or meant % unit_mib or not 0 < meant < UNREALISTIC_CARD_MIB:
            meant = Fraction(EXAMPLE_MIB)
        return (f"{name} counts {unit_text(unit_mib)}: {count} is {size_text(count * unit_mib)}; "
                f"for {size_text(meant)} write {meant / unit_mib}")
    return None
