"""What a release tag publishes, checked before anything is pushed (scripts/release.py and
.github/workflows/release.yml; docs/releasing.md)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

import gpupool
from tests.deploy.helm_render import require_helm
from tests.deploy.kustomize_render import ROOT


def _load_release() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release_script", ROOT / "scripts" / "release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


release = _load_release()
VERSION = gpupool.__version__


def project_copy(tmp_path: Path, dated: bool = True) -> Path:
    """The files a release check reads, copied (the CHANGELOG's section dated or not)."""
    for name in ("pyproject.toml", "gpupool/__init__.py", "charts/gpupool/Chart.yaml", "CHANGELOG.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    if dated:
        changelog = tmp_path / "CHANGELOG.md"
        changelog.write_text(changelog.read_text().replace(f"## [{VERSION}] - Unreleased",
                                                           f"## [{VERSION}] - 2026-12-01"))
    return tmp_path


def test_every_place_names_the_same_version() -> None:
    assert set(release.versions().values()) == {VERSION}, release.versions()


def test_a_tag_is_released_only_when_everything_agrees_with_it(tmp_path: Path) -> None:
    root = project_copy(tmp_path)
    assert release.check(f"v{VERSION}", root) == VERSION
    with pytest.raises(release.ReleaseError) as caught:
        release.check("v9.9.9", root)
    message = str(caught.value)
    for where in ("pyproject.toml says", "gpupool/__init__.py says", "Chart.yaml version says",
                  "Chart.yaml appVersion says", "no section '## [9.9.9] - YYYY-MM-DD'"):
        assert where in message, message
    with pytest.raises(release.ReleaseError, match=r"v<major>\.<minor>\.<patch>"):
        release.check("0.1.0", root)


def test_an_undated_changelog_section_stops_the_release(tmp_path: Path) -> None:
    root = project_copy(tmp_path, dated=False)
    with pytest.raises(release.ReleaseError, match=r"Unreleased'.*date it"):
        release.check(f"v{VERSION}", root)
    assert subprocess.run([sys.executable, str(ROOT / "scripts/release.py"), "check", "--tag", "v9.9.9"],
                          capture_output=True, text=True, check=False).returncode == 1


def test_the_notes_are_the_changelog_section_alone(tmp_path: Path) -> None:
    root = project_copy(tmp_path)
    changelog = root / "CHANGELOG.md"
    changelog.write_text(changelog.read_text() + "\n## [0.0.1] - 2026-01-01\nA-LATER-SECTION-MARKER\n")
    text = release.notes(VERSION, root)
    assert text.startswith("The first release") and "### Upgrade notes" in text
    assert "A-LATER-SECTION-MARKER" not in text and f"## [{VERSION}]" not in text


def test_only_the_charts_own_image_is_pointed_at_the_registry() -> None:
    values = (ROOT / "charts/gpupool/values.yaml").read_text()
    published = yaml.safe_load(release.with_published_image(values, "ghcr.io/acme"))
    original = yaml.safe_load(values)
    assert published["image"]["repository"] == "ghcr.io/acme/gpupool"
    assert published["scheduler"]["image"] == original["scheduler"]["image"]
    assert {k: v for k, v in published.items() if k != "image"} == {k: v for k, v in original.items() if k != "image"}
    with pytest.raises(release.ReleaseError, match="lower-case registry path"):
        release.with_published_image(values, "GHCR.io/Acme")


def test_the_packaged_chart_installs_the_published_image_by_default(tmp_path: Path) -> None:
    helm = require_helm()
    package = release.package_chart("ghcr.io/acme", tmp_path / "dist", helm)
    assert package == tmp_path / "dist" / f"gpupool-{VERSION}.tgz" and package.is_file()
    rendered = subprocess.run([helm, "template", "gpupool", str(package), "--namespace", "gpupool-system"],
                              capture_output=True, text=True, check=True).stdout
    images = {c["image"] for d in yaml.safe_load_all(rendered) if d and d["kind"] in ("Deployment", "DaemonSet")
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert f"ghcr.io/acme/gpupool:{VERSION}" in images, images
    assert not any(i.startswith("gpupool:") for i in images), images
    assert (ROOT / "charts/gpupool/values.yaml").read_text().count("repository: gpupool\n") == 1  # untouched


def test_the_workflow_publishes_only_what_the_check_passed() -> None:
    workflow = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())
    assert workflow[True] == {"push": {"tags": ["v*"]}}  # YAML 1.1 reads the key `on` as true
    steps = workflow["jobs"]["publish"]["steps"]
    runs = [str(s.get("run", "")) for s in steps]
    first_push = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("docker/build-push-action"))
    checked = next(i for i, r in enumerate(runs) if 'scripts/release.py check --tag "$GITHUB_REF_NAME"' in r)
    assert checked < first_push
    pushed = steps[first_push]["with"]
    assert pushed["push"] is True and pushed["tags"].endswith("/gpupool:${{ steps.release.outputs.version }}")
    chart = next(r for r in runs if "package-chart" in r)
    assert "helm push" in chart and "--registry \"ghcr.io/${{ steps.release.outputs.owner }}\"" in chart
    assert any("scripts/release.py notes" in r and "gh release create" in r for r in runs)
