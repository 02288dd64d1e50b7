"""The GPU client init container's image: the extender's own by default (gpupool/extender/client_image.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpupool.extender.client_image import client_image


def pod(*containers: tuple[str, str]) -> Any:
    return SimpleNamespace(spec=SimpleNamespace(containers=[SimpleNamespace(name=n, image=i) for n, i in containers]))


def reader(found: Any) -> Any:
    calls: list[tuple[str, str]] = []

    def read(name: str, namespace: str) -> Any:
        calls.append((namespace, name))
        if isinstance(found, Exception):
            raise found
        return found

    read.calls = calls  # type: ignore[attr-defined]
    return read


def test_the_flag_wins_and_none_turns_the_injection_off() -> None:
    read = reader(pod(("extender", "own:1")))
    assert client_image("mirror.example/gpupool:1", ("gpupool-system", "x"), read) == "mirror.example/gpupool:1"
    assert client_image("none", ("gpupool-system", "x"), read) is None
    assert read.calls == []


def test_by_default_the_extenders_own_image_read_from_its_pod() -> None:
    read = reader(pod(("proxy", "envoy:1"), ("extender", "ghcr.io/x/gpupool:0.9")))
    assert client_image(None, ("gpupool-system", "gpupool-extender-abc"), read) == "ghcr.io/x/gpupool:0.9"
    assert read.calls == [("gpupool-system", "gpupool-extender-abc")]
    assert client_image(None, ("ns", "p"), reader(pod(("main", "gpupool:2")))) == "gpupool:2"  # the only one


@pytest.mark.parametrize("found", [RuntimeError("403 forbidden"), pod(("a", "x"), ("b", "y")), pod()])
def test_an_unreadable_or_unknown_pod_injects_nothing_with_a_warning(found: Any,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    assert client_image(None, ("ns", "p"), reader(found)) is None
    assert "--remote-client-image" in caplog.text


def test_outside_a_pod_nothing_unless_named() -> None:
    assert client_image(None, None, reader(pod(("extender", "x")))) is None
