"""Unit tests of the build cache logic (no compiling: ``go build`` is replaced by a stand-in)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpupool.testenv import build, gobuild
from gpupool.testenv.errors import BuildFailedError, BuildImpossibleError
from gpupool.testenv.paths import CACHE_ENV, K8S_COMMANDS, cache_dir
from gpupool.testenv.versions import NEWEST, OLDEST, RELEASES, VERSION_ENV, release

#: The shape of Kubernetes' own go.mod that the wrapper is derived from.
KUBERNETES_MOD = """module k8s.io/kubernetes

go 1.26.0

godebug default=go1.26

require (
\tgithub.com/spf13/cobra v1.10.1
\tk8s.io/api v0.0.0
\tk8s.io/apimachinery v0.0.0
\tk8s.io/kube-openapi v0.0.0-20260721132016-d427ff9ee9ad
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/apimachinery => ./staging/src/k8s.io/apimachinery
\tk8s.io/sample-controller => ./staging/src/k8s.io/sample-controller
)
"""


@pytest.fixture
def fake_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache, a Go that passes the toolchain check, and ``go build`` replaced by a stand-in
    that writes an executable where ``-o`` points (recording each command)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(VERSION_ENV, raising=False)
    monkeypatch.setattr(gobuild, "toolchain_problem", lambda: None)
    monkeypatch.setattr(build, "toolchain_problem", lambda: None)
    monkeypatch.setattr(gobuild, "go_binary", lambda: Path("/usr/local/go/bin/go"))
    return tmp_path / "cache"


def _executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def _stand_in_go_build(commands: list[list[str]], fail_on: str | None = None) -> object:
    def run(cmd: list[str], log_path: Path, *, failure: type[Exception], step: str,
            cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        commands.append(list(cmd))
        output = cmd[cmd.index("-o") + 1]
        packages = cmd[cmd.index("-o") + 2:]
        if fail_on is not None and any(p.endswith(fail_on) for p in packages):
            raise failure(f"{step} failed; full log: {log_path}")
        for package in packages:  # -o names a directory when several packages are built at once
            _executable(Path(output) / package.rsplit("/", 1)[-1] if output.endswith("/") else Path(output))
    return run


def _download_kubernetes(fake_cache: Path) -> Path:
    """What ``go mod download`` leaves: the module's directory and its cached ``.mod`` file."""
    source = Path(gobuild.go_env()["GOMODCACHE"]) / f"k8s.io/kubernetes@{NEWEST.kubernetes}"
    source.mkdir(parents=True)
    (source / "go.mod").write_text(KUBERNETES_MOD)
    mod_file = build._cached_mod_file(build.KUBERNETES_MODULE, NEWEST.kubernetes)
    mod_file.parent.mkdir(parents=True)
    mod_file.write_text(KUBERNETES_MOD)
    return source


def test_the_wrapper_replaces_each_required_staging_module_by_its_published_release() -> None:
    text = build.kubernetes_go_mod(KUBERNETES_MOD, NEWEST)
    assert f"\tk8s.io/kubernetes {NEWEST.kubernetes}" in text
    assert f"\tk8s.io/api => k8s.io/api {NEWEST.staging}" in text
    assert f"\tk8s.io/apimachinery => k8s.io/apimachinery {NEWEST.staging}" in text
    # a staging module nothing requires (never published) and a real pseudo-version stay alone
    assert "sample-controller" not in text and "kube-openapi" not in text
    # Kubernetes relies on its own go and godebug lines
    assert "\ngo 1.26.0\n" in text and "godebug default=go1.26" in text


def test_a_kubernetes_go_mod_without_staging_modules_is_refused() -> None:
    with pytest.raises(BuildFailedError, match="staging"):
        build.kubernetes_go_mod("module k8s.io/kubernetes\n\ngo 1.26.0\n", NEWEST)


def test_the_binaries_carry_the_release_as_their_version() -> None:
    flags = build._version_ldflags(NEWEST)
    major, minor = NEWEST.minor.split(".")
    assert f"-X k8s.io/component-base/version.gitVersion={NEWEST.kubernetes}" in flags
    assert f"-X k8s.io/component-base/version.gitMinor={minor}" in flags
    assert f"-X k8s.io/client-go/pkg/version.gitMajor={major}" in flags


def test_release_defaults_to_the_newest_and_accepts_a_minor_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(VERSION_ENV, raising=False)
    assert release() == NEWEST
    assert release(OLDEST.minor) == OLDEST
    assert release(OLDEST.kubernetes.removeprefix("v")) == OLDEST
    monkeypatch.setenv(VERSION_ENV, OLDEST.kubernetes)
    assert release() == OLDEST
    assert [r.kubernetes for r in RELEASES] == sorted((r.kubernetes for r in RELEASES), reverse=True,
                                                      key=lambda v: tuple(int(x) for x in v[1:].split(".")))


def test_an_unpinned_release_is_refused_naming_the_supported_ones() -> None:
    with pytest.raises(ValueError, match=NEWEST.kubernetes.replace(".", r"\.")):
        release("1.20.2")


def test_staging_version_follows_the_release() -> None:
    assert release("v1.37.2").staging == "v0.37.2"


def test_empty_cache_is_a_miss(fake_cache: Path) -> None:
    assert build.cached_binaries() is None


def test_a_build_fills_every_entry_and_the_next_call_is_a_hit(
    fake_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _download_kubernetes(fake_cache)
    commands: list[list[str]] = []
    monkeypatch.setattr(gobuild, "run_step", _stand_in_go_build(commands))
    monkeypatch.setattr(build, "kubernetes_source", lambda rel, log: source)
    binaries = build.ensure_binaries()
    assert binaries.version == NEWEST.kubernetes and binaries.missing() == []
    built = [c[c.index("-o") + 2:] for c in commands]
    # the Kubernetes programs in one command (go links one while compiling the next), -o a directory
    assert built == [["go.etcd.io/etcd/server/v3"], [f"k8s.io/kubernetes/cmd/{c}" for c in K8S_COMMANDS],
                     ["gpupool.local/testenv/cmd/gpupool-fakecri"]]
    assert commands[1][commands[1].index("-o") + 1].endswith("/bin.partial/")
    assert binaries.kubelet == cache_dir() / f"kubernetes-{NEWEST.kubernetes}" / "bin" / "kubelet"
    # the fake runtime's source is in its wrapper module, compiled against the same go.mod
    wrapper = binaries.fakecri.parent.parent / "module"
    assert (wrapper / "cmd" / "gpupool-fakecri" / "main.go").read_bytes() == build.fakecri_source().read_bytes()
    assert (wrapper / "go.mod").read_text() == build.kubernetes_go_mod(KUBERNETES_MOD, NEWEST)
    assert build.cached_binaries() == binaries


def test_a_failed_build_leaves_no_entry_to_use(fake_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kubelet fails after kube-apiserver and kube-scheduler compiled: the release's entry does not
    exist (nothing half-built is used) and the error names the step's log."""
    source = _download_kubernetes(fake_cache)
    monkeypatch.setattr(gobuild, "run_step", _stand_in_go_build([], fail_on="cmd/kubelet"))
    monkeypatch.setattr(build, "kubernetes_source", lambda rel, log: source)
    with pytest.raises(BuildFailedError, match=r"kubelet.*log"):
        build.ensure_binaries()
    assert not (cache_dir() / f"kubernetes-{NEWEST.kubernetes}" / "bin").exists()
    assert build.cached_binaries() is None


def test_a_changed_fakecri_source_builds_only_a_new_fake_runtime_beside_the_old_one(
    fake_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = _download_kubernetes(fake_cache)
    commands: list[list[str]] = []
    monkeypatch.setattr(gobuild, "run_step", _stand_in_go_build(commands))
    monkeypatch.setattr(build, "kubernetes_source", lambda rel, log: source)
    first = build.ensure_binaries()
    changed = tmp_path / "main.go"
    changed.write_text("package main // changed\n")
    monkeypatch.setattr(build, "fakecri_source", lambda: changed)
    commands.clear()
    second = build.ensure_binaries()
    assert [c[-1] for c in commands] == ["gpupool.local/testenv/cmd/gpupool-fakecri"]
    assert second.fakecri != first.fakecri and first.fakecri.is_file()
    assert second.kubelet == first.kubelet


def test_an_entry_whose_stamp_names_another_spec_is_a_miss(fake_cache: Path) -> None:
    spec = gobuild.GoBuild(key="x-v1", go_mod="module a\n", programs=(gobuild.GoProgram("x", "example.com/x"),))
    _executable(spec.bin_dir() / "x")
    (spec.bin_dir() / gobuild.STAMP).write_text("0" * 64)
    assert not spec.is_built()
    (spec.bin_dir() / gobuild.STAMP).write_text(spec.digest())
    assert spec.is_built()
    other = gobuild.GoBuild(key="x-v1", go_mod="module a\n", programs=spec.programs, tags=("no_btrfs",))
    assert not other.is_built()


def test_cache_hit_neither_builds_nor_locks(fake_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hit returns the cached binaries without the lock or a build (what makes it instant; a
    wall-clock bound here would flake on a loaded CI machine)."""
    source = _download_kubernetes(fake_cache)
    monkeypatch.setattr(gobuild, "run_step", _stand_in_go_build([]))
    monkeypatch.setattr(build, "kubernetes_source", lambda rel, log: source)
    built = build.ensure_binaries()

    def forbidden(*_: object, **__: object) -> None:
        raise AssertionError("a cache hit must not reach this step")

    monkeypatch.setattr(build, "exclusive_lock", forbidden)
    monkeypatch.setattr(build, "build", forbidden)
    assert build.ensure_binaries() == built


def test_parallel_callers_build_once(fake_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _download_kubernetes(fake_cache)
    commands: list[list[str]] = []
    stand_in = _stand_in_go_build(commands)

    def slow(*args: object, **kwargs: object) -> None:
        time.sleep(0.05)
        stand_in(*args, **kwargs)  # type: ignore[operator]

    monkeypatch.setattr(gobuild, "run_step", slow)
    monkeypatch.setattr(build, "kubernetes_source", lambda rel, log: source)
    results = []
    threads = [threading.Thread(target=lambda: results.append(build.ensure_binaries())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(commands) == 3  # etcd, the Kubernetes programs, the fake runtime: once
    assert len(results) == 4 and len(set(results)) == 1


def test_fakecri_source_ships_with_the_package() -> None:
    text = build.fakecri_source().read_text()
    assert "package main" in text
    assert "k8s.io/cri-client/pkg/fake" in text and "k8s.io/cri-api/pkg/apis/runtime/v1\"" in text


def test_without_go_the_build_is_impossible_and_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(gobuild.shutil, "which", lambda name: None)
    monkeypatch.setattr(gobuild, "GO_FALLBACK", tmp_path / "no-go")
    reason = build.build_impossible_reason()
    assert reason is not None and "Go not found" in reason and "1.26" in reason
    with pytest.raises(BuildImpossibleError, match="Go not found"):
        build.ensure_binaries()


def test_an_old_go_is_named_with_the_version_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    go = tmp_path / "go"
    go.write_text("#!/bin/sh\necho go version go1.19.8 linux/amd64\n")
    go.chmod(0o755)
    monkeypatch.setattr(gobuild.shutil, "which", lambda name: str(go))
    problem = gobuild.toolchain_problem()
    assert problem is not None and "go1.19" in problem and "1.26" in problem


def test_go_runs_with_the_projects_caches_and_never_downloads_a_toolchain(fake_cache: Path) -> None:
    env = gobuild.go_env()
    assert env["GOMODCACHE"] == str(fake_cache / "go" / "mod")
    assert env["GOCACHE"] == str(fake_cache / "go" / "build")
    assert env["GOTOOLCHAIN"] == "local"
    assert env["CGO_ENABLED"] == "0" and gobuild.go_env(cgo=True)["CGO_ENABLED"] == "1"


def _failing_download(output: str) -> object:
    def run(cmd: list[str], log_path: Path, *, failure: type[Exception], step: str, **_: object) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(output)
        raise failure(f"{step} failed (exit 1); full log: {log_path}")
    return run


def test_a_version_the_proxy_does_not_serve_is_a_build_failure_naming_the_step_and_log(
    fake_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(gobuild, "run_step", _failing_download(
        "go: k8s.io/kubernetes@v1.99.0: reading https://proxy/k8s.io/kubernetes/@v/v1.99.0.info: 404 Not Found\n"))
    with pytest.raises(BuildFailedError, match=r"go mod download k8s.io/kubernetes@v1.99.0.*does not serve.*log"):
        gobuild.module_dir("k8s.io/kubernetes", "v1.99.0", logs=tmp_path)


def test_an_unreachable_proxy_makes_the_build_impossible_not_failed(
    fake_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(gobuild, "run_step", _failing_download(
        "go: k8s.io/kubernetes@v1.37.2: Get \"https://proxy.example/\": "
        "dial tcp: lookup proxy.example: no such host\n"))
    with pytest.raises(BuildImpossibleError, match="cannot be reached"):
        gobuild.module_dir("k8s.io/kubernetes", "v1.37.2", logs=tmp_path)
