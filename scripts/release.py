#!/usr/bin/env python3
"""Release checks and packaging for maintainers: what a tag ``vX.Y.Z`` publishes, checked first.

One version names everything a release publishes (CHANGELOG.md's opening): the Python package
(``pyproject.toml``, ``gpupool.__version__``), the image tag and the Helm chart's ``version`` and
``appVersion``. A tag is published only when all of them equal it and CHANGELOG.md has a dated
section for it, so a release can never ship an image whose chart names another tag, or notes that
are still "Unreleased". The release workflow (.github/workflows/release.yml) runs::

    python3 scripts/release.py check --tag v0.1.0
    python3 scripts/release.py notes --version 0.1.0        # the GitHub release's text
    python3 scripts/release.py package-chart --registry ghcr.io/OWNER --out dist

``package-chart`` packages a copy of charts/gpupool whose default image is the published one
(``REGISTRY/gpupool``, tag = appVersion), so ``helm install oci://...`` needs no ``--set image.*``;
the chart in the repository keeps the local name ``gpupool`` that a self-built image uses.
Standard library only: it runs on a bare CI runner before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = Path("charts/gpupool")
IMAGE_NAME = "gpupool"


class ReleaseError(Exception):
    """The release cannot go ahead; the message says what to fix."""


def _match(pattern: str, text: str, where: str) -> str:
    found = re.search(pattern, text, re.MULTILINE)
    if found is None:
        raise ReleaseError(f"{where}: no version found (looked for {pattern!r})")
    return found.group(1)


def versions(root: Path = ROOT) -> dict[str, str]:
    """Every place a release's version is written, by where it is."""
    chart = (root / CHART / "Chart.yaml").read_text(encoding="utf-8")
    project = (root / "pyproject.toml").read_text(encoding="utf-8")
    package = (root / "gpupool/__init__.py").read_text(encoding="utf-8")
    return {
        "pyproject.toml": _match(r'^version\s*=\s*"([^"]+)"', project, "pyproject.toml"),
        "gpupool/__init__.py": _match(r'^__version__\s*=\s*"([^"]+)"', package, "gpupool/__init__.py"),
        "Chart.yaml version": _match(r'^version:\s*"?([^"\s]+)"?', chart, "Chart.yaml"),
        "Chart.yaml appVersion": _match(r'^appVersion:\s*"?([^"\s]+)"?', chart, "Chart.yaml"),
    }


def changelog_heading(version: str, root: Path = ROOT) -> str | None:
    """CHANGELOG.md's heading line for ``version`` (``## [0.1.0] - 2026-12-01``), or None."""
    for line in (root / "CHANGELOG.md").read_text(encoding="utf-8").splitlines():
        if line.startswith(f"## [{version}]"):
            return line
    return None


def check(tag: str, root: Path = ROOT) -> str:
    """The version ``tag`` publishes, once everything agrees with it; else :class:`ReleaseError`
    naming every disagreement at once."""
    if not re.fullmatch(r"v\d+\.\d+\.\d+(-[0-9A-Za-z.]+)?", tag):
        raise ReleaseError(f"tag {tag!r}: a release tag is v<major>.<minor>.<patch>, such as v0.1.0")
    version = tag.removeprefix("v")
    problems = [f"{where} says {found}" for where, found in versions(root).items() if found != version]
    heading = changelog_heading(version, root)
    if heading is None:
        problems.append(f"CHANGELOG.md has no section '## [{version}] - YYYY-MM-DD'")
    elif not re.fullmatch(rf"## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}", heading.strip()):
        problems.append(f"CHANGELOG.md's section is {heading.strip()!r}: date it ('## [{version}] - YYYY-MM-DD')")
    if problems:
        raise ReleaseError(f"tag {tag} cannot be released: " + "; ".join(problems))
    return version


def notes(version: str, root: Path = ROOT) -> str:
    """CHANGELOG.md's section for ``version``, without its heading (the release's text)."""
    lines = (root / "CHANGELOG.md").read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"## [{version}]")), None)
    if start is None:
        raise ReleaseError(f"CHANGELOG.md has no section for {version}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[start + 1:end]).strip() + "\n"


def with_published_image(values: str, registry: str) -> str:
    """values.yaml with the chart's own image (the top-level ``image:`` block, not the scheduler's)
    defaulting to ``REGISTRY/gpupool``."""
    if not re.fullmatch(r"[a-z0-9.-]+(:\d+)?(/[a-z0-9._-]+)*", registry):
        raise ReleaseError(f"registry {registry!r}: want a lower-case registry path such as ghcr.io/owner")
    block = re.search(r"^image:\n(?:[ \t]+.*\n|\s*\n)*?[ \t]+repository:[ \t]*(\S+)[ \t]*$", values, re.MULTILINE)
    if block is None:
        raise ReleaseError("values.yaml: no 'repository:' under the top-level 'image:'")
    return values[:block.start(1)] + f"{registry}/{IMAGE_NAME}" + values[block.end(1):]


def package_chart(registry: str, out: Path, helm: str = "helm", root: Path = ROOT) -> Path:
    """``helm package`` a copy of the chart whose default image is the published one; the package's path."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        copy = Path(work) / CHART.name
        shutil.copytree(root / CHART, copy)
        values = copy / "values.yaml"
        values.write_text(with_published_image(values.read_text(encoding="utf-8"), registry), encoding="utf-8")
        done = subprocess.run([helm, "package", str(copy), "--destination", str(out)], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            raise ReleaseError(f"helm package failed: {done.stderr.strip() or done.stdout.strip()}")
    version = versions(root)["Chart.yaml version"]
    return out / f"{CHART.name}-{version}.tgz"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    checking = commands.add_parser("check", help="refuse a tag that the versions or CHANGELOG.md disagree with")
    checking.add_argument("--tag", required=True)
    noting = commands.add_parser("notes", help="print CHANGELOG.md's section for a version")
    noting.add_argument("--version", required=True)
    packing = commands.add_parser("package-chart", help="package the chart with the published image as default")
    packing.add_argument("--registry", required=True, help="where the image is pushed, e.g. ghcr.io/owner")
    packing.add_argument("--out", type=Path, default=Path("dist"))
    packing.add_argument("--helm", default="helm")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            print(check(args.tag))
        elif args.command == "notes":
            sys.stdout.write(notes(args.version))
        else:
            print(package_chart(args.registry, args.out, args.helm))
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
