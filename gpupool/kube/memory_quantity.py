"""Card memory written as a size (``4Gi``, ``1536Mi``) where the resource counts units: the count
to write instead, for the pod webhook to put into the pod before it is stored.

Why at admission: kubelet counts an extended resource as a plain integer, one device each, so
``gpupool.io/gpu-mem: 4Gi`` stored as written would ask kubelet for 4,294,967,296 devices of 256
MiB. A mutating webhook sees the pod before it is validated and stored, and can replace the size
by the count it means (``16``); the pod then reads, schedules and runs as if ``16`` had been
written, and kubectl shows the webhook's warning saying so.

Which spellings are sizes: a quantity with a *binary* suffix (``Ki``, ``Mi``, ``Gi``, ``Ti``,
``Pi``, ``Ei``). Plain numbers stay counts, as always. Decimal suffixes are not read as sizes: the
apiserver writes a count of 1000 as ``1k`` before any webhook sees the pod, so ``4G`` and a count
of 4,000,000,000 cannot be told apart (the extender refuses such a count, naming the unit and what
to write: :func:`gpupool.kube.memory_units.unit_problem`). A size that is not a whole number of units
is rounded up to the next unit (a slice is granted in whole units; ``1000Mi`` becomes 4 units, 1
GiB), and the warning says so.

Both ``limits`` and ``requests`` are rewritten (the apiserver has already copied a limit into the
requests when only the limit was written), in app, init and ephemeral containers alike.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from gpupool.api.fields import shown
from gpupool.api.limits import text_problem
from gpupool.api.names import NVIDIA_GPUMEM, ResourceNames
from gpupool.kube.memory_units import BYTES_PER_MIB, memory_units, size_text, unit_text
from gpupool.kube.quantity import QuantityError, parse_quantity

CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
RESOURCE_PARTS = ("limits", "requests")
_SIZE = re.compile(r"\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[KMGTPE]i)")
"""A quantity with a binary suffix: what users write for a size, never for a count."""


@dataclass(frozen=True)
class SizeRewrite:
    """One resource value written as a size, and the count of units it becomes."""

    container: str
    field: str
    """The container's list: ``containers``, ``initContainers`` or ``ephemeralContainers``."""
    index: int
    resource: str
    part: str
    """``limits`` or ``requests``."""
    written: str
    count: int
    unit_mib: int
    rounded: bool
    """Whether the size was not a whole number of units and was rounded up."""

    @property
    def path(self) -> str:
        """The JSON pointer of the value in the pod."""
        return _pointer("spec", self.field, self.index, "resources", self.part, self.resource)

    def patch(self) -> dict[str, Any]:
        """The JSON patch operation that writes the count (a string, as the API writes quantities)."""
        return {"op": "replace", "path": self.path, "value": str(self.count)}

    def warning(self) -> str:
        """What kubectl shows the user: what was written, what it became and why."""
        rounded = ", rounded up to a whole unit" if self.rounded else ""
        return (f"gpupool: container {self.container}: {self.resource} counts {unit_text(self.unit_mib)}: "
                f"{self.written} rewritten as {self.count} ({size_text(self.count * self.unit_mib)}){rounded}")


def rewritten_units(names: ResourceNames) -> dict[str, int]:
    """The resources whose sizes are rewritten, with the MiB one unit is: those the extender reads
    in units (:func:`gpupool.kube.memory_units.memory_units`) and HAMi's ``nvidia.com/gpumem`` (MiB)."""
    return {**memory_units(names), NVIDIA_GPUMEM: 1}


def is_size(value: Any) -> bool:
    """Whether a resource value is written as a memory size (a binary suffix), see the module doc."""
    return isinstance(value, str) and _SIZE.fullmatch(value.strip()) is not None


def units_of_size(value: str, unit_mib: int) -> tuple[int, bool]:
    """The count of ``unit_mib`` units that holds the size ``value``, and whether it was rounded up;
    :class:`QuantityError` when it is no quantity."""
    size_bytes = parse_quantity(value.strip())
    exact = size_bytes / Decimal(unit_mib * BYTES_PER_MIB)
    count = int(exact.to_integral_value(rounding=ROUND_CEILING))
    return count, Decimal(count) != exact


def _pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901): ``~`` and ``/`` in a part escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _entries(pod: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    spec = _mapping(pod.get("spec"))
    for field in CONTAINER_LISTS:
        entries = spec.get(field)
        if isinstance(entries, list):
            for i, entry in enumerate(entries):
                yield field, i, _mapping(entry)


def size_rewrites(pod: Mapping[str, Any], names: ResourceNames) -> tuple[SizeRewrite, ...]:
    """Every memory value of ``pod`` (a Pod as JSON) written as a size, with its count; values that
    are not quantities are left for the apiserver's validation to refuse."""
    units = rewritten_units(names)
    found: list[SizeRewrite] = []
    for field, i, container in _entries(pod):
        resources = _mapping(container.get("resources"))
        for part in RESOURCE_PARTS:
            for resource, value in _mapping(resources.get(part)).items():
                unit_mib = units.get(resource)
                if unit_mib is None or not is_size(value):
                    continue
                try:
                    count, rounded = units_of_size(value, unit_mib)
                except QuantityError:
                    continue
                name = container.get("name")
                label = name if isinstance(name, str) and name and text_problem(name) is None else shown(name)
                found.append(SizeRewrite(label[:253], field, i, resource, part, value.strip(), count,
                                         unit_mib, rounded))
    return tuple(found)


def with_counts(pod: Mapping[str, Any], rewrites: tuple[SizeRewrite, ...]) -> Mapping[str, Any]:
    """``pod`` as it is stored once ``rewrites`` are applied (a copy; ``pod`` itself unchanged)."""
    if not rewrites:
        return pod
    patched: dict[str, Any] = copy.deepcopy(dict(pod))
    for r in rewrites:
        patched["spec"][r.field][r.index]["resources"][r.part][r.resource] = str(r.count)
    return patched
