"""Unit tests of ``gpupool testenv`` that need no cluster: state file handling and env output."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from gpupool.cli.main import cli
from gpupool.testenv.statefile import EnvState, load_state, save_state


def _state(tmp_path: Path) -> EnvState:
    return EnvState(control_plane={"kubeconfig": str(tmp_path / "kubeconfig"), "processes": [
        {"name": "etcd", "pid": 2**22 + 1, "executable": "/usr/bin/etcd", "log_path": "/dev/null"}]})


def test_env_without_a_running_environment_fails_clearly(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["testenv", "env", "--state-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert "gpupool testenv up" in result.output


def test_env_prints_export_lines(tmp_path: Path) -> None:
    save_state(tmp_path, _state(tmp_path))
    result = CliRunner().invoke(cli, ["testenv", "env", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"export KUBECONFIG={tmp_path / 'kubeconfig'}",
        f"export GPUPOOL_TESTENV_STATE={tmp_path}",
    ]


def test_state_round_trip_and_dead_pids_are_not_running(tmp_path: Path) -> None:
    save_state(tmp_path, _state(tmp_path))
    state = load_state(tmp_path)
    assert state is not None
    assert state.kubeconfig == tmp_path / "kubeconfig"
    assert not state.running()  # that pid is above the kernel's pid limit


def test_down_removes_a_stale_state_dir(tmp_path: Path) -> None:
    state_dir = tmp_path / "env"
    state_dir.mkdir()
    save_state(state_dir, _state(tmp_path))
    result = CliRunner().invoke(cli, ["testenv", "down", "--state-dir", str(state_dir)])
    assert result.exit_code == 0, result.output
    assert not state_dir.exists()


def test_down_with_nothing_recorded_is_a_no_op(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["testenv", "down", "--state-dir", str(tmp_path / "none")])
    assert result.exit_code == 0
    assert "nothing to stop" in result.output


def test_up_rejects_an_unknown_runtime(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["testenv", "up", "--state-dir", str(tmp_path), "--runtime", "docker"])
    assert result.exit_code != 0
    assert "'fake', 'containerd'" in result.output


def test_up_hands_the_runtime_to_every_kubelet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--runtime containerd`` reaches ``start_kubelet`` and each node's images are printed."""
    from gpupool.cli import testenv_cmd

    started: list[tuple[str, str]] = []

    class Plane:
        remove_state_on_stop = True
        server = "https://127.0.0.1:6443"

        def to_record(self) -> dict[str, object]:
            return {"kubeconfig": str(tmp_path / "kubeconfig"), "processes": []}

    class Node:
        node_ip, port = "192.0.2.1", 10250
        runtime = SimpleNamespace(images=SimpleNamespace(busybox=SimpleNamespace(ref="gpupool.local/busybox:k"),
                                                         dynamic=SimpleNamespace(ref="gpupool.local/dynamic:k")))

        def to_record(self) -> dict[str, object]:
            return {"processes": []}

    def start_kubelet(_plane: object, node: str, *, runtime: str, log: object) -> Node:
        started.append((node, runtime))
        return Node()

    asked: list[str | None] = []

    def ensure_binaries(log: object, version: str | None) -> SimpleNamespace:
        asked.append(version)
        return SimpleNamespace(version="v1.35.4")

    monkeypatch.setattr(testenv_cmd, "ensure_binaries", ensure_binaries)
    monkeypatch.setattr(testenv_cmd, "start_control_plane", lambda *a, **k: Plane())
    monkeypatch.setattr(testenv_cmd, "start_kubelet", start_kubelet)
    result = CliRunner().invoke(cli, ["testenv", "up", "--state-dir", str(tmp_path), "--runtime", "containerd",
                                      "--version", "1.35", "--kubelet", "a", "--kubelet", "b"])
    assert result.exit_code == 0, result.output
    assert asked == ["1.35"] and "Kubernetes v1.35.4" in result.output  # up says which release runs
    assert started == [("a", "containerd"), ("b", "containerd")]
    assert "gpupool.local/busybox:k" in result.output


def test_a_release_that_is_not_pinned_is_refused_with_the_supported_ones(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["testenv", "build", "--version", "1.20.2"])
    assert result.exit_code != 0
    assert "1.20.2 is not a release" in result.output and "v1.37.2" in result.output


def test_the_state_file_keeps_the_demos_processes_and_down_stops_them_first(tmp_path: Path) -> None:
    import sys

    from gpupool.testenv.procs import ManagedProcess, spawn

    sleeper = spawn("gpupool-extender", [sys.executable, "-c", "import time; time.sleep(60)"],
                    tmp_path / "sleeper.log")
    try:
        state_dir = tmp_path / "env"
        state_dir.mkdir()
        state = _state(tmp_path)
        state.processes = [sleeper.to_record()]
        save_state(state_dir, state)
        loaded = load_state(state_dir)
        assert loaded is not None and loaded.processes == [sleeper.to_record()]
        assert loaded.running()  # a demo process alone counts as up
        result = CliRunner().invoke(cli, ["testenv", "down", "--state-dir", str(state_dir)])
        assert result.exit_code == 0, result.output
        assert not ManagedProcess.from_record(sleeper.to_record()).alive()
    finally:
        if sleeper.popen is not None and sleeper.popen.poll() is None:
            sleeper.popen.kill()
        if sleeper.popen is not None:
            sleeper.popen.wait(timeout=10)


@pytest.mark.parametrize("extra", [
    pytest.param(["--kubelet", "n"], id="kubelet"),
    pytest.param(["--extender-url", "http://127.0.0.1:1"], id="extender-url"),
    pytest.param(["--runtime", "containerd"], id="containerd"),
])
def test_demo_refuses_options_it_sets_itself(extra: list[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["testenv", "up", "--demo", "--state-dir", str(tmp_path), *extra])
    assert result.exit_code == 2
    assert "--demo starts its own extender and node" in result.output


def test_the_demo_pod_asks_gpupools_scheduler_for_a_slice() -> None:
    from gpupool.cli.testenv_demo import demo_pod, scheduler_config

    pod = demo_pod()
    assert pod["spec"]["schedulerName"] == "gpupool-scheduler"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"gpupool.io/gpu-mem": "16",
                                                                  "gpupool.io/gpu-core": "30"}
    config = scheduler_config(Path("/k"), "http://127.0.0.1:1")
    assert [p["schedulerName"] for p in config["profiles"]] == ["gpupool-scheduler"]
    (extender,) = config["extenders"]
    assert (extender["filterVerb"], extender["bindVerb"], extender["preemptVerb"]) == ("filter", "bind", "preempt")
    assert "prioritizeVerb" not in extender  # the extender filters best-only by default, as deployed


def test_build_builds_both_helms_before_kubernetes_and_helm_3_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gpupool testenv build`` leaves both Helms in the cache, so the chart's Helm 3 tests run
    instead of being skipped; the test command's first phase passes ``--no-helm3`` and its checks
    lane (``--version oldest``) builds Helm 3 first, before the unit tests that need it, beside the
    end-to-end suite rather than before both lanes."""
    from gpupool.cli import testenv_cmd
    from gpupool.testenv.helm import HELM_3, HELM_4, HelmRelease

    built: list[object] = []

    def ensure_helm(log: object, release: HelmRelease = HELM_4) -> Path:
        built.append(release)
        return Path(f"/cache/helm-{release.version}/bin/helm")

    def ensure_binaries(log: object, version: str | None) -> SimpleNamespace:
        built.append(f"kubernetes {version}")
        return SimpleNamespace(kubectl="/k")

    monkeypatch.setattr(testenv_cmd, "ensure_binaries", ensure_binaries)
    monkeypatch.setattr(testenv_cmd, "ensure_helm", ensure_helm)
    result = CliRunner().invoke(cli, ["testenv", "build", "--version", "oldest"])
    assert result.exit_code == 0, result.output
    assert built == [HELM_4, HELM_3, "kubernetes oldest"]
    assert f"helm3: /cache/helm-{HELM_3.version}/bin/helm" in result.output
    built.clear()
    result = CliRunner().invoke(cli, ["testenv", "build", "--no-helm3"])
    assert result.exit_code == 0, result.output
    assert built == [HELM_4, "kubernetes None"] and "helm3:" not in result.output
    script = (Path(__file__).parents[2] / "scripts" / "test-all").read_text()
    assert 'gpupool testenv build --no-helm3\n' in script and "gpupool testenv build --version oldest &&" in script
