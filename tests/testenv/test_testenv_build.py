"""Unit tests of the build cache logic (no compiling: the expensive step is replaced)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpupool.testenv import build
from gpupool.testenv.paths import CACHE_ENV, FAKECRI_COMMAND, K8S_COMMANDS, bin_dir, cache_dir


@pytest.fixture
def fake_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    etcd = tmp_path / "etcd"
    _executable(etcd)
    monkeypatch.setattr(build, "system_etcd", lambda: etcd)
    return tmp_path / "cache"


def _executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def _fill_cache(digest: str) -> None:
    for name in K8S_COMMANDS:
        _executable(bin_dir() / name)
    for name, patch in build.PATCHED.items():
        (bin_dir() / f".{name}.{patch}").touch()
    _executable(bin_dir() / f"{FAKECRI_COMMAND}-{digest[:build.FAKECRI_KEY_LENGTH]}")


def test_cache_dir_follows_the_environment(fake_cache: Path) -> None:
    assert cache_dir() == fake_cache
    assert bin_dir() == fake_cache / "bin"


def test_default_cache_dir_is_outside_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert cache_dir() == Path.home() / ".cache" / "gpupool" / "k8s-v1.20.2"


def test_empty_cache_is_a_miss(fake_cache: Path) -> None:
    assert build.cached_binaries() is None


def test_complete_cache_is_a_hit(fake_cache: Path) -> None:
    _fill_cache(build.fakecri_digest())
    binaries = build.cached_binaries()
    assert binaries is not None
    assert binaries.kubelet == fake_cache / "bin" / "kubelet"
    assert binaries.missing() == []


def test_changed_fakecri_source_invalidates_the_cache(fake_cache: Path) -> None:
    _fill_cache("0" * 64)
    assert build.cached_binaries() is None


def test_fake_runtime_binary_is_keyed_by_its_source(fake_cache: Path) -> None:
    _fill_cache(build.fakecri_digest())
    binaries = build.cached_binaries()
    assert binaries is not None
    assert binaries.fakecri == build.fakecri_binary()
    assert binaries.fakecri.name == f"{FAKECRI_COMMAND}-{build.fakecri_digest()[:16]}"


def test_changed_source_rebuilds_only_the_fake_runtime_beside_the_old_one(
    fake_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another checkout's fake runtime (older source, maybe running right now) is left untouched:
    the new one gets its own name, built with ``go build`` (no ``make`` of the Kubernetes tree)."""
    _fill_cache("0" * 64)
    other = bin_dir() / f"{FAKECRI_COMMAND}-{'0' * 16}"
    before = other.stat().st_ino
    tree = fake_cache / "src" / "kubernetes"
    (tree / "cmd").mkdir(parents=True)
    commands: list[list[str]] = []

    def fake_run(cmd: list[str], log_path: Path, *, failure: type[Exception], step: str,
                 cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        commands.append(list(cmd))
        linked = tree / "_output" / "local" / "go" / "src" / "k8s.io" / "kubernetes"
        assert cmd[:2] == ["go", "build"] and env is not None and cwd == linked
        assert env["GO111MODULE"] == "off" and env["PWD"] == str(linked)  # Kubernetes 1.20: GOPATH mode
        assert env["GOCACHE"] == str(fake_cache / "go-cache-fakecri")  # kept: quick rebuilds
        package = linked / cmd[-1]
        assert (package / "main.go").read_text() == build.fakecri_source().read_text()
        _executable(Path(cmd[cmd.index("-o") + 1]))

    monkeypatch.setattr(build, "_run", fake_run)
    monkeypatch.setattr(build, "_install_packages", lambda logs, log: None)
    monkeypatch.setattr(build, "_source_tree", lambda root, logs, log: tree)
    binaries = build._build(fake_cache, lambda _: None)
    assert len(commands) == 1
    assert binaries.fakecri == build.fakecri_binary() and binaries.missing() == []
    assert other.stat().st_ino == before
    assert build.cached_binaries() == binaries
    assert not list((tree / "cmd").iterdir())  # the per-hash package directory is removed


def test_an_apiserver_built_before_the_reflect2_patch_is_built_again_from_the_patched_tree(
    fake_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache from before the patch (no stamp) is a miss; only kube-apiserver is compiled again, after
    the vendored reflect2 is replaced, and the stamp makes the next call a hit."""
    _fill_cache(build.fakecri_digest())
    stamp = bin_dir() / ".kube-apiserver.reflect2-1.0.2"
    stamp.unlink()
    assert build.cached_binaries() is None
    tree = fake_cache / "src" / "kubernetes"
    vendored = tree / "vendor" / "github.com" / "modern-go" / "reflect2"
    vendored.mkdir(parents=True)
    (vendored / "old_only.go").write_text("package reflect2 // 1.0.1\n")
    source = fake_cache / "reflect2-1.0.2"
    source.mkdir()
    (source / "go_above_118.go").write_text("package reflect2 // 1.0.2\n")
    (source / "reflect2_test.go").write_text("package reflect2\n")
    made: list[list[str]] = []

    def fake_run(cmd: list[str], log_path: Path, **_: object) -> None:
        made.append(list(cmd))
        assert sorted(p.name for p in vendored.iterdir()) == ["go_above_118.go"]
        _executable(tree / "_output" / "bin" / "kube-apiserver")

    monkeypatch.setattr(build, "REFLECT2_SOURCE", source)
    monkeypatch.setattr(build, "_run", fake_run)
    monkeypatch.setattr(build, "_install_packages", lambda logs, log: None)
    monkeypatch.setattr(build, "_source_tree", lambda root, logs, log: tree)
    build._build(fake_cache, lambda _: None)
    assert made == [["make", "WHAT=cmd/kube-apiserver"]]
    assert stamp.is_file() and build.cached_binaries() is not None


def test_cache_hit_neither_builds_nor_locks(fake_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hit returns the cached binaries without the build-possible probe, the lock or a build
    (what made it instant; a wall-clock bound here would flake on a loaded CI machine)."""
    _fill_cache(build.fakecri_digest())

    def forbidden(*_: object) -> None:
        raise AssertionError("a cache hit must not reach this step")

    monkeypatch.setattr(build, "build_impossible_reason", forbidden)
    monkeypatch.setattr(build, "_exclusive_lock", forbidden)
    monkeypatch.setattr(build, "_build", forbidden)
    assert build.ensure_binaries().kubelet == fake_cache / "bin" / "kubelet"


def test_parallel_callers_build_once(fake_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def slow_build(root: Path, log: build.Log) -> object:
        calls.append(1)
        time.sleep(0.5)
        _fill_cache(build.fakecri_digest())
        binaries = build.cached_binaries()
        assert binaries is not None
        return binaries

    monkeypatch.setattr(build, "_build", slow_build)
    monkeypatch.setattr(build, "build_impossible_reason", lambda: None)
    results = []
    threads = [threading.Thread(target=lambda: results.append(build.ensure_binaries())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len(results) == 4 and len(set(results)) == 1


def test_private_apt_options_keep_system_config_untouched(tmp_path: Path) -> None:
    options = build.private_apt_options(tmp_path)
    values = options[1::2]
    assert f"Dir::Etc::SourceList={tmp_path / 'sources.list'}" in values
    assert "Dir::Etc::SourceParts=/dev/null" in values
    assert f"Dir::State::Lists={tmp_path / 'lists'}" in values
    assert f"Dir::Cache={tmp_path / 'cache'}" in values
    assert options[0::2] == ["-o"] * 4


def test_fakecri_source_ships_with_the_package() -> None:
    text = build.fakecri_source().read_text()
    assert "package main" in text
    assert "pkg/kubelet/cri/remote/fake" in text


def test_build_is_impossible_without_apt(fake_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    reason = build.build_impossible_reason()
    assert reason is not None and "apt-get" in reason
    with pytest.raises(build.BuildImpossibleError, match="apt-get"):
        build.ensure_binaries()


def test_build_is_impossible_for_non_root_without_tools(
    fake_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name: None if name == "go" else f"/usr/bin/{name}")
    monkeypatch.setattr(build.os, "geteuid", lambda: 1000)
    reason = build.build_impossible_reason()
    assert reason is not None and "go" in reason and "root" in reason


def test_a_complete_cache_is_usable_even_where_building_is_impossible(
    fake_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill_cache(build.fakecri_digest())
    monkeypatch.setattr(build.os, "geteuid", lambda: 1000)
    assert build.build_impossible_reason() is None


def test_install_refreshes_package_lists_once_when_install_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    commands: list[list[str]] = []

    def fake_run(cmd: list[str], log_path: Path, *, failure: type[Exception], step: str,
                 **_: object) -> None:
        commands.append(list(cmd))
        if cmd[:2] == ["apt-get", "install"] and len(commands) == 1:
            raise failure("stale lists")

    monkeypatch.setattr(build, "_run", fake_run)
    build._install_packages(tmp_path, lambda _: None)
    assert [c[:2] for c in commands] == [["apt-get", "install"], ["apt-get", "update"],
                                         ["apt-get", "install"]]
    assert {"golang-go", "etcd-server", "rsync", "make"} <= set(commands[0])
