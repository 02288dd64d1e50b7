"""Unit tests of the Helm build (pure: the wrapper module, the version stamp, the cache; ``go build``
is replaced by a stand-in)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.testenv import gobuild, helm
from gpupool.testenv.paths import CACHE_ENV, cache_dir
from gpupool.testenv.versions import HELM, HELM3

#: The shape of Helm's own go.mod (no replace lines).
HELM_MOD = """module helm.sh/helm/v4

go 1.26.0

require (
\tk8s.io/client-go v0.37.1
)
"""


def test_the_wrapper_requires_the_pin_and_keeps_helms_go_line() -> None:
    text = helm.helm_go_mod(HELM_MOD.replace("go 1.26.0", "go 1.26.2"))
    assert f"\thelm.sh/helm/v4 {HELM}\n" in text
    assert "\ngo 1.26.2\n" in text
    assert "k8s.io/client-go" not in text  # Helm's own requirements are read by go from its go.mod


def test_the_build_stamps_the_pinned_version_into_helms_command() -> None:
    spec = helm.helm_build(HELM_MOD)
    assert spec.key == f"helm-{HELM}"
    assert [(p.name, p.package) for p in spec.programs] == [("helm", "helm.sh/helm/v4/cmd/helm")]
    assert f"-X helm.sh/helm/v4/internal/version.version={HELM}" in spec.ldflags
    assert not spec.cgo


HELM3_MOD = """module helm.sh/helm/v3

go 1.26.0

require (
\tk8s.io/api v0.37.0
\tk8s.io/client-go v0.37.0
)
"""


def test_helm_3_is_its_own_module_and_cache_entry_with_the_pinned_3x_release() -> None:
    spec = helm.helm_build(HELM3_MOD, helm.HELM_3)
    assert HELM3.startswith("v3.") and spec.key == f"helm-{HELM3}" != f"helm-{HELM}"
    assert [(p.name, p.package) for p in spec.programs] == [("helm", "helm.sh/helm/v3/cmd/helm")]
    assert f"\thelm.sh/helm/v3 {HELM3}\n" in spec.go_mod and "helm.sh/helm/v4" not in spec.go_mod
    assert f"-X helm.sh/helm/v3/internal/version.version={HELM3}" in spec.ldflags


def test_helm_3_renders_for_the_kubernetes_of_its_client_go_not_1_20() -> None:
    """Helm 3's Makefile stamps the client-go minor in; without it ``helm template`` assumes
    Kubernetes 1.20 and refuses the chart (``kubeVersion: >=1.30``)."""
    flags = helm.helm_build(HELM3_MOD, helm.HELM_3).ldflags
    for package in ("lint/rules", "chartutil"):
        assert f"-X helm.sh/helm/v3/pkg/{package}.k8sVersionMajor=1 " in flags
        assert f"-X helm.sh/helm/v3/pkg/{package}.k8sVersionMinor=37" in flags
    assert "k8sVersion" not in helm.helm_build(HELM_MOD).ldflags  # Helm 4 reads it from the build


@pytest.fixture
def fake_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(gobuild, "toolchain_problem", lambda: None)
    monkeypatch.setattr(helm, "toolchain_problem", lambda: None)
    monkeypatch.setattr(gobuild, "go_binary", lambda: Path("/usr/local/go/bin/go"))
    return tmp_path / "cache"


def _download(log_dir: Path) -> Path:
    """What ``go mod download`` leaves: the source and the cached ``.mod``."""
    source = log_dir / "helm-source"
    source.mkdir(parents=True, exist_ok=True)
    (source / "go.mod").write_text(HELM_MOD)
    mod_file = helm._cached_mod_file()
    mod_file.parent.mkdir(parents=True, exist_ok=True)
    mod_file.write_text(HELM_MOD)
    return source


def test_a_build_fills_the_entry_under_its_own_lock_and_the_next_call_is_a_hit(
    fake_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []
    locks: list[Path] = []

    def go_build(cmd: list[str], log_path: Path, **_: object) -> None:
        commands.append(cmd)
        out = Path(cmd[cmd.index("-o") + 1])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("#!/bin/sh\n")
        out.chmod(0o755)

    real_lock = helm.exclusive_lock

    def lock(path: Path, log: object) -> object:
        locks.append(path)
        return real_lock(path, lambda _m: None)

    monkeypatch.setattr(gobuild, "run_step", go_build)
    monkeypatch.setattr(helm, "module_dir", lambda module, version, logs, log: _download(logs))
    monkeypatch.setattr(helm, "exclusive_lock", lock)
    assert helm.cached_helm() is None
    binary = helm.ensure_helm()
    assert binary == cache_dir() / f"helm-{HELM}" / "bin" / "helm"
    assert [c[-1] for c in commands] == ["helm.sh/helm/v4/cmd/helm"]
    assert locks == [cache_dir() / ".helm-build.lock"]
    commands.clear()
    assert helm.ensure_helm() == binary and commands == [] and len(locks) == 1
