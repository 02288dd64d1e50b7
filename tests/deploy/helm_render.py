"""Render charts/gpupool with the real ``helm`` (built from its pinned Go module by
``gpupool testenv build``), never one found on the machine; without that build the tests that need
it are skipped with that reason.

Rendering is ``helm template``: the chart's templates with the values given, exactly what ``helm
install`` would send, without a cluster (the chart's ``lookup`` of the bootstrap CA finds nothing).
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpupool.testenv.helm import cached_helm
from tests.deploy.kustomize_render import ROOT
from tests.deploy.yaml_documents import documents

CHART = ROOT / "charts" / "gpupool"
RELEASE = "gpupool"
RENDER_TIMEOUT_S = 60
_BUILT = cached_helm()
HELM = str(_BUILT) if _BUILT is not None else None
NO_HELM = ("the test environment's helm is not built (run `gpupool testenv build`): the chart is linted and "
           "rendered with the real helm")


def require_helm() -> str:
    """helm's path, or skip the calling test."""
    if HELM is None:
        pytest.skip(NO_HELM)
    return HELM


def helm(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm with ``args``; the caller checks the result."""
    return subprocess.run([require_helm(), *args], capture_output=True, text=True, timeout=RENDER_TIMEOUT_S,
                          check=False, cwd=cwd)


def set_args(values: Mapping[str, Any]) -> list[str]:
    """``--set-json`` arguments for ``values`` (dotted keys → JSON values: types survive)."""
    return [arg for key, value in values.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]


@functools.cache
def _template(values: tuple[tuple[str, str], ...], files: tuple[tuple[str, str], ...], crds: bool) -> str:
    args = ["template", RELEASE, str(CHART), "--namespace", "gpupool-system"]
    if crds:
        args.append("--include-crds")
    for key, value in values:
        args += ["--set-json", f"{key}={value}"]
    for key, path in files:
        args += ["--set-file", f"{key}={path}"]
    result = helm(*args)
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return result.stdout


def render(values: Mapping[str, Any] | None = None, *, files: Mapping[str, Path] | None = None,
           crds: bool = False) -> list[dict[str, Any]]:
    """The objects ``helm template`` renders with ``values`` (dotted keys) and ``files`` (``--set-file``),
    a fresh copy each call; with ``crds`` the chart's CRDs too."""
    key = tuple(sorted((k, json.dumps(v)) for k, v in (values or {}).items()))
    file_key = tuple(sorted((k, str(v)) for k, v in (files or {}).items()))
    text = _template(key, file_key, crds)
    return documents(text)


def template_error(values: Mapping[str, Any]) -> str:
    """helm template's error output for values it must refuse (asserts that it does)."""
    result = helm("template", RELEASE, str(CHART), *set_args(values))
    assert result.returncode != 0, f"helm template accepted {dict(values)}"
    return result.stderr


def find(docs: Sequence[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of ``kind`` named ``name`` (asserts there is exactly one)."""
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{len(matches)} {kind} named {name}"
    return matches[0]
