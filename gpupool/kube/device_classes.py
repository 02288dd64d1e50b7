"""Which DeviceClasses are gpupool's, and what their own selectors add to a claim request's
selection (issue 24, docs/dra.md "Selectors the extender reads").

Why: admins make their own classes for gpupool's driver (``a100-share``, selecting
``model.startsWith("NVIDIA-A100")``); a claim naming one asks for gpupool's cards, and the
allocator applies the class's selectors as well as the request's. The extender therefore counts a
class as gpupool's and ANDs its selectors with each request's.

A class is gpupool's when one of its selectors requires ``device.driver == "<driver>"`` (the whole
expression, or one operand of its top-level ``&&``): then no other driver's device can match it.
A class with a selector outside the subset :mod:`gpupool.kube.device_selector` reads, or one whose
text names the driver without requiring it, is gpupool's with a ``problem``: its claims are left to
kube-scheduler (the pod-scheduler webhook still steers their pods, which costs only the scheduler's
name). Any other class is not gpupool's (as before classes were read: its claims are another
driver's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.kube.device_selector import (
    MAX_SELECTORS,
    Compare,
    DeviceSchema,
    DriverRef,
    Lit,
    Logic,
    Node,
    Selection,
    Unsupported,
    parse,
)


@dataclass(frozen=True)
class ClassReading:
    """One DeviceClass as the extender reads it: whether it is gpupool's, the selection its
    selectors add beyond pinning the driver (None: nothing more), or why they cannot be read."""

    gpupool: bool
    selection: Selection | None = None
    problem: str | None = None


def _pins(node: Node, driver: str) -> bool:
    """Whether ``node`` is true only for ``driver``'s devices: ``device.driver == "<driver>"``, or
    a top-level ``&&`` with such an operand."""
    if isinstance(node, Logic):
        return node.op == "&&" and (_pins(node.left, driver) or _pins(node.right, driver))
    if isinstance(node, Compare) and node.op == "==":
        sides = (node.left, node.right)
        return any(isinstance(s, DriverRef) for s in sides) and any(
            isinstance(s, Lit) and s.value == driver for s in sides)
    return False


def read_device_class(obj: Mapping[str, Any], driver: str, schema: DeviceSchema) -> ClassReading:
    """DeviceClass ``obj`` (as the API serves it) for gpupool's ``driver``. Never raises."""
    spec = obj.get("spec")
    selectors = spec.get("selectors") if isinstance(spec, Mapping) else None
    if not isinstance(selectors, list):
        return ClassReading(False)
    texts: list[str] = []
    for entry in selectors[:MAX_SELECTORS + 1]:
        cel = entry.get("cel") if isinstance(entry, Mapping) else None
        text = cel.get("expression") if isinstance(cel, Mapping) else None
        texts.append(text if isinstance(text, str) else "")
    pinned = False
    kept: list[tuple[str, Node]] = []
    problem: str | None = None
    if len(selectors) > MAX_SELECTORS:
        problem = f"more than {MAX_SELECTORS} selectors"
    for text in texts:
        try:
            tree = parse(text, schema)
        except Unsupported as exc:
            problem = problem or f"selector not read: {exc}"
            continue
        if isinstance(tree, Compare) and _pins(tree, driver):
            pinned = True  # the driver's pin alone: true on every card the ledger holds
            continue
        pinned = pinned or _pins(tree, driver)
        kept.append((text, tree))
    if not pinned:
        if not any(f'"{driver}"' in text or f"'{driver}'" in text for text in texts):
            return ClassReading(False)
        problem = problem or f"no selector requires device.driver == {driver!r}"
    if problem is not None:
        return ClassReading(True, problem=problem)
    if not kept:
        return ClassReading(True)
    return ClassReading(True, Selection(tuple(t for t, _ in kept), tuple(n for _, n in kept)))
