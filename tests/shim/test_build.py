"""Building the library: cached by digest, a clear error without a compiler, the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli.main import cli
from gpupool.shim import build
from gpupool.shim.build import ShimBuildError, build_library, library_path
from gpupool.shim.region import RegionFormatError, parse_region

# Slow, so scripts/test-all runs it and a plain pytest does not: compiles the interception library several times.
pytestmark = pytest.mark.slow


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty library cache of the test's own, and no packaged library."""
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(build, "PACKAGED_LIBRARY", tmp_path / "absent" / "libgpupool-shim.so")
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("module") / "cache"


@pytest.fixture()
def built(module_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A library cache this module's tests share, and no packaged library: the first test to ask
    builds the library there (~10 s), the others find it (each had built it into a cache of its own)."""
    monkeypatch.setenv(build.CACHE_ENV, str(module_cache))
    monkeypatch.setattr(build, "PACKAGED_LIBRARY", tmp_path / "absent" / "libgpupool-shim.so")
    return module_cache


def test_a_built_library_is_reused_until_a_source_changes(built: Path) -> None:
    first = build_library()
    stamp = first.stat().st_mtime_ns
    assert build_library() == first
    assert first.stat().st_mtime_ns == stamp
    assert first.parent == built and first.name.startswith("libgpupool-shim-release-")


def test_shim_path_prints_the_absolute_path_of_the_library(built: Path) -> None:
    result = CliRunner().invoke(cli, ["shim", "path"])
    assert result.exit_code == 0, result.output
    path = Path(result.output.strip())
    assert path.is_absolute() and path.is_file() and path.parent == built


def test_a_packaged_library_wins(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    packaged = tmp_path / "lib" / "libgpupool-shim.so"
    packaged.parent.mkdir()
    packaged.write_bytes(b"\x7fELF")
    monkeypatch.setattr(build, "PACKAGED_LIBRARY", packaged)
    assert library_path() == packaged
    assert not cache.exists()


@pytest.mark.parametrize("cc", [None, "/nonexistent/cc"], ids=["nothing-on-path", "bad-CC"])
def test_without_a_compiler_the_error_says_what_to_install(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path, cc: str | None) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    if cc is None:
        monkeypatch.delenv("CC", raising=False)
    else:
        monkeypatch.setenv("CC", cc)
    with pytest.raises(ShimBuildError, match="apt-get install gcc"):
        build_library()
    result = CliRunner().invoke(cli, ["shim", "path"])
    assert result.exit_code == 1
    assert "no C compiler found" in result.output and "Traceback" not in result.output


def test_a_compile_error_is_reported_with_the_compiler_output(cache: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "src"
    broken.mkdir()
    (broken / "broken.c").write_text("this is not C;\n")
    monkeypatch.setattr(build, "SOURCE_DIR", broken)
    with pytest.raises(ShimBuildError, match=r"broken\.c"):
        build_library(tmp_path / "out.so")
    assert not (tmp_path / "out.so").exists()


def test_a_file_that_is_not_a_region_is_refused() -> None:
    with pytest.raises(RegionFormatError):
        parse_region(b"\0" * 100)
    with pytest.raises(RegionFormatError):
        parse_region(b"\0" * 39552)


def test_the_image_ships_the_library_where_shim_path_looks() -> None:
    """The Docker image builds the library into the package (its runtime stage has no compiler)."""
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    site_packages = "/install/lib/python3.11/site-packages/"
    packaged = site_packages + str(build.PACKAGED_LIBRARY.relative_to(build.PACKAGE_DIR.parent.parent))
    assert f"shim build \\\n      --output {packaged}" in dockerfile
    assert "gcc libc6-dev" in dockerfile


def test_shim_build_writes_where_asked(tmp_path: Path) -> None:
    target = tmp_path / "lib" / "libgpupool-shim.so"
    result = CliRunner().invoke(cli, ["shim", "build", "--output", str(target)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(target) and target.read_bytes().startswith(b"\x7fELF")
