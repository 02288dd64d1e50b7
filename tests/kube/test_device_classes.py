"""Which DeviceClasses are gpupool's and what their selectors add (issue 24, docs/dra.md
"Selectors the extender reads"): gpupool/kube/device_classes.py."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.kube.device_classes import read_device_class
from gpupool.kube.device_selector import device_schema

DRIVER = "gpu.gpupool.io"
PINS = f'device.driver == "{DRIVER}"'
MODEL = f'device.attributes["{DRIVER}"].model.startsWith("NVIDIA-A100")'


def read(*expressions: Any) -> Any:
    obj = {"metadata": {"name": "c"}, "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]}}
    return read_device_class(obj, DRIVER, device_schema(DRIVER))


def test_the_class_gpupool_installs_is_gpupools_and_adds_nothing() -> None:
    reading = read(PINS)
    assert reading.gpupool and reading.selection is None and reading.problem is None


@pytest.mark.parametrize("expressions", [
    (PINS, MODEL),
    (f"{PINS} && {MODEL}",),
    (f"{MODEL} && {PINS}",),
    (f'"{DRIVER}" == device.driver', MODEL),
])
def test_a_class_requiring_the_driver_is_gpupools_with_its_other_selectors(expressions: tuple[str, ...]) -> None:
    reading = read(*expressions)
    assert reading.gpupool and reading.problem is None and reading.selection is not None
    assert MODEL in " ".join(reading.selection.texts)


@pytest.mark.parametrize("expressions", [
    ('device.driver == "nic.example.com"',),
    (),
    ('device.driver.startsWith("nic")',),
    ('device.attributes["nic.example.com"].speed.matches("100G")',),
])
def test_a_class_that_never_names_the_driver_is_not_gpupools(expressions: tuple[str, ...]) -> None:
    reading = read(*expressions)
    assert not reading.gpupool and reading.problem is None


def test_a_class_without_selectors_or_malformed_is_not_gpupools() -> None:
    assert not read_device_class({"metadata": {"name": "c"}, "spec": {}}, DRIVER, device_schema(DRIVER)).gpupool
    assert not read_device_class({"spec": "x"}, DRIVER, device_schema(DRIVER)).gpupool


@pytest.mark.parametrize(("expressions", "why"), [
    ((PINS, f'device.attributes["{DRIVER}"].model.matches("A100")'), "matches"),
    ((f'{PINS} && device.attributes["{DRIVER}"].model.matches("A100")',), "matches"),
    ((f'{PINS} || device.driver == "other.example.com"',), "no selector requires"),
    ((PINS, 42), "selector not read"),
])
def test_a_class_of_the_driver_that_cannot_be_read_is_gpupools_with_the_reason(
        expressions: tuple[Any, ...], why: str) -> None:
    reading = read(*expressions)
    assert reading.gpupool and reading.selection is None and reading.problem is not None and why in reading.problem
