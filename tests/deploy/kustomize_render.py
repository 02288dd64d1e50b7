"""Render deploy/kustomize with the real ``kubectl kustomize`` (kubectl carries kustomize).

The tests read what an admin's ``kubectl apply -k`` would send, not the files one by one: a patch
of an overlay that misses its target, or a component that breaks the base, shows only in the
rendered output. kubectl is the one the test environment builds (``gpupool testenv build``, which
``scripts/test-all`` runs first), never one found on the machine; without that build the tests that
need it are skipped with that reason.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpupool.testenv.build import cached_binaries
from tests.deploy.yaml_documents import documents

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZE = DEPLOY / "kustomize"
OVERLAYS = ("production", "production-cert-manager", "dev")
RENDER_TIMEOUT_S = 60
_BUILT = cached_binaries()
KUBECTL = str(_BUILT.kubectl) if _BUILT is not None else None
NO_KUBECTL = ("the test environment's kubectl is not built (run `gpupool testenv build`): the kustomize "
              "package is rendered with the real kubectl kustomize")


def require_kubectl() -> str:
    """kubectl's path, or skip the calling test."""
    if KUBECTL is None:
        pytest.skip(NO_KUBECTL)
    return KUBECTL


@functools.cache
def render_text(directory: str) -> str:
    """``kubectl kustomize <directory>`` (relative to deploy/kustomize), as YAML text."""
    result = subprocess.run([require_kubectl(), "kustomize", str(KUSTOMIZE / directory)], capture_output=True,
                            text=True, timeout=RENDER_TIMEOUT_S, check=False)
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return result.stdout


def render(directory: str) -> list[dict[str, Any]]:
    """The rendered objects (a fresh copy each call: callers may change them)."""
    return documents(render_text(directory))


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec of a workload (Deployment, DaemonSet, Job, CronJob, Pod); ``None`` for others."""
    kind, spec = doc["kind"], doc.get("spec", {})
    if kind == "Pod":
        return dict(spec)
    if kind in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
        return dict(spec["template"]["spec"])
    if kind == "CronJob":
        return dict(spec["jobTemplate"]["spec"]["template"]["spec"])
    return None
