"""Unit tests of ``gpupool testenv`` that need no cluster: state file handling and env output."""

from __future__ import annotations

from pathlib import Path

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
