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
