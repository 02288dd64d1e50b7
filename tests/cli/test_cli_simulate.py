"""``gpupool simulate`` as a user runs it: options, JSON shape, plot, errors, and a fast start."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli.main import SUBCOMMANDS, cli

NODES_CSV = """\
sn,cpu_milli,memory_mib,gpu,model
n0,64000,262144,2,T4
n1,64000,262144,2,T4
"""
#: Four whole-card pods fill the four cards exactly; the simulator clones them up to 130 %.
PODS_CSV = """\
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,1000,1024,1,1000,,LS,Running,0,100,0
p1,1000,1024,1,1000,,LS,Running,10,200,10
p2,1000,1024,1,1000,,LS,Running,20,300,20
p3,1000,1024,1,1000,,LS,Running,30,400,30
"""


@pytest.fixture
def small_cluster(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text(NODES_CSV)
    pods.write_text(PODS_CSV)
    return nodes, pods


def _simulate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["simulate", *args])
    return result.exit_code, result.output


def test_json_reports_medians_and_per_seed_values(small_cluster: tuple[Path, Path]) -> None:
    nodes, pods = small_cluster
    code, out = _simulate("--nodes", str(nodes), "--trace", str(pods), "--policy", "bestfit",
                          "--seeds", "1-3", "--json", "--jobs", "1")
    assert code == 0, out
    report = json.loads(out)
    assert report["policy"] == "bestfit"
    assert report["seeds"] == [1, 2, 3]
    assert set(report["unallocated_pct_at"]) == {"90", "95", "100", "110", "130"}
    assert report["unallocated_pct_at"]["100"] == 0.0  # four whole cards for four whole-card pods
    # Each pod is 25 % of the cluster: at 90 % arrived the state is still that after 75 %.
    assert report["unallocated_pct_at"]["90"] == report["unallocated_pct_at"]["95"] == 25.0
    assert report["unallocated_pct_at"]["130"] is None  # the clones stop at 125 %: never reached
    assert set(report["per_seed"]) == {"1", "2", "3"}
    assert all(seed["failed_pods"] >= 1 for seed in report["per_seed"].values())  # the clones beyond 100 %


def test_several_policies_are_reported_side_by_side(small_cluster: tuple[Path, Path]) -> None:
    nodes, pods = small_cluster
    code, out = _simulate("--nodes", str(nodes), "--trace", str(pods), "--policy", "fgd",
                          "--policy", "gpupool", "--seeds", "7", "--json", "--jobs", "1")
    assert code == 0, out
    assert [r["policy"] for r in json.loads(out)["policies"]] == ["fgd", "gpupool"]


@pytest.mark.slow
def test_table_and_plot(small_cluster: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = small_cluster
    png = tmp_path / "curves.png"
    code, out = _simulate("--nodes", str(nodes), "--trace", str(pods), "--seeds", "1",
                          "--plot", str(png), "--jobs", "1")
    assert code == 0, out
    assert "gpupool" in out and "plot written to" in out
    row = next(line for line in out.splitlines() if line.startswith("gpupool"))
    assert row.split()[1:6] == ["25.00", "25.00", "0.00", "0.00", "-"]  # 90 95 100 110 130
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "one point of unallocated GPU is 0.04 GPUs of this cluster's 4" in out  # 4 cards
    assert "published" not in out  # the paper has no numbers for a user's own trace


def test_timeline_mode_json(small_cluster: tuple[Path, Path]) -> None:
    nodes, pods = small_cluster
    code, out = _simulate("--nodes", str(nodes), "--trace", str(pods), "--mode", "timeline", "--json")
    assert code == 0, out
    (result,) = json.loads(out)["policies"]
    assert result["refused_pods"] == 0
    assert result["peak_allocated_gpu_pct"] == pytest.approx(100.0)


@pytest.mark.slow  # a timeline replay with and without lending (scripts/test-all runs it)
def test_lending_replay_json(small_cluster: tuple[Path, Path]) -> None:
    nodes, pods = small_cluster
    code, out = _simulate("--nodes", str(nodes), "--trace", str(pods), "--mode", "timeline", "--lending",
                          "--hours", "12", "--lending-nodes", "2", "--load", "2", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["lending"] is True and report["setup"]["cluster_gpus"] == 4
    assert report["gpu_hours_recovered_pct"] >= 0
    assert report["without_lending"]["borrowed_gpu_hours"] == 0
    assert report["without_lending"]["mean_wait_hours"] > 0  # twice the load the cluster holds: pods wait
    assert [row["idle_share"] for row in report["by_idle_share"]] == [0.1, 0.2, 0.3, 0.4, 0.5]


@pytest.mark.slow  # a timeline replay with and without lending (scripts/test-all runs it)
def test_lending_replay_table(small_cluster: tuple[Path, Path]) -> None:
    nodes, pods = small_cluster
    code, out = _simulate("--nodes", str(nodes), "--trace", str(pods), "--mode", "timeline", "--lending",
                          "--hours", "6", "--lending-nodes", "2")
    assert code == 0, out
    assert "gpu_hours_recovered_pct:" in out and "idle share" in out and "lends / reclaims" in out


@pytest.mark.slow  # three timeline replays: without lending, lending, lending with remote borrowers
def test_lending_replay_with_remote_borrowers(small_cluster: tuple[Path, Path]) -> None:
    nodes, pods = small_cluster
    code, out = _simulate("--nodes", str(nodes), "--trace", str(pods), "--mode", "timeline", "--lending",
                          "--hours", "12", "--lending-nodes", "2", "--remote-borrow", "--cpu-nodes", "3", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["remote_borrow"] is True and report["cpu_nodes"] == 3
    assert report["with_lending"]["remote_borrow"] is True
    assert report["with_lending_local_only"]["remote_borrow"] is False
    assert report["with_lending_local_only"]["remote_starts"] == 0
    code, out = _simulate("--nodes", str(nodes), "--trace", str(pods), "--mode", "timeline", "--lending",
                          "--hours", "6", "--lending-nodes", "2", "--remote-borrow")
    assert code == 0, out
    assert "remote borrowing (16 nodes without GPUs added" in out and "remote starts / pods" in out


@pytest.mark.slow
@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--lending"], "--lending replays arrivals in time: add --mode timeline", id="lending-packing"),
    pytest.param(["--mode", "timeline", "--lending", "--idle-share", "1"], "Invalid value for '--idle-share'",
                 id="always-idle"),
    pytest.param(["--remote-borrow"], "--remote-borrow and --cpu-nodes belong to the lending replay",
                 id="remote-alone"),
    pytest.param(["--mode", "timeline", "--lending", "--cpu-nodes", "4"], "--cpu-nodes adds nodes for remote borrowers",
                 id="cpu-nodes-without-remote"),
    pytest.param(["--trace", "no-such-trace"], "no bundled trace or file named 'no-such-trace'", id="unknown-trace"),
    pytest.param(["--seeds", "9-3"], "use a seed, a list (42,43) or a range (42-51)", id="reversed-seed-range"),
    pytest.param(["--policy", "nope"], "Invalid value for '--policy'", id="unknown-policy"),
])
def test_bad_arguments_get_a_clear_error(args: list[str], message: str) -> None:
    code, out = _simulate(*args)
    assert code != 0
    assert message in out


def test_every_subcommand_is_listed_and_loads() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in SUBCOMMANDS:
        assert name in result.output
        assert CliRunner().invoke(cli, [name, "--help"]).exit_code == 0


@pytest.mark.slow
def test_simulate_does_not_import_the_kubernetes_client_or_grpc() -> None:
    """The simulator is the first thing a user runs; the cluster adapters' imports cost it ~1.3 s."""
    probe = ("import sys\nfrom click.testing import CliRunner\nfrom gpupool.cli.main import cli\n"
             "assert CliRunner().invoke(cli, ['simulate', '--help']).exit_code == 0\n"
             "print(sorted(m for m in ('kubernetes', 'grpc', 'prometheus_client') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _modules_after(code: str, names: tuple[str, ...]) -> list[str]:
    probe = f"import sys\n{code}\nprint(sorted(m for m in {names!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return list(ast.literal_eval(out.strip()))


@pytest.mark.slow
def test_simulate_imports_what_only_some_modes_need_when_they_run() -> None:
    """Tenants (YAML, the API's codecs), the timeline and worker processes are not loaded for a
    packing replay, and a single run shows no progress bar (nor imports tqdm): a one-seed replay
    takes about 2.5 s, and these imports were about a tenth of it."""
    optional = ("yaml", "gpupool.api.quota", "gpupool.cli.simulate_tenants", "gpupool.sim.timeline",
                "concurrent.futures.process", "tqdm")
    assert _modules_after("from click.testing import CliRunner\nfrom gpupool.cli.main import cli\n"
                          "assert CliRunner().invoke(cli, ['simulate', '--help']).exit_code == 0", optional) == []
    assert _modules_after("from gpupool.cli.simulate_cmd import _progress\n"
                          "with _progress(1) as done:\n    done()", ("tqdm",)) == []
    assert _modules_after("from gpupool.cli.simulate_cmd import _progress\n"
                          "with _progress(2) as done:\n    done()", ("tqdm",)) == ["tqdm"]


def test_the_table_says_what_its_columns_mean(small_cluster: tuple[Path, Path]) -> None:
    nodes, pods = small_cluster
    code, out = _simulate("--nodes", str(nodes), "--trace", str(pods), "--seeds", "1", "--jobs", "1")
    assert code == 0, out
    legend = out[out.index("s/seed\n"):]
    for column in ("90%..130%:", "failed:", "s/seed:"):
        assert column in legend, out
    assert "in % of the cluster's GPUs" in legend and "never reached" in legend


def test_the_timeline_table_says_what_its_columns_mean(small_cluster: tuple[Path, Path]) -> None:
    nodes, pods = small_cluster
    code, out = _simulate("--nodes", str(nodes), "--trace", str(pods), "--mode", "timeline")
    assert code == 0, out
    assert "hour: the trace's clock" in out and "refused: pods refused so far" in out


def test_plot_without_matplotlib_fails_before_simulating(small_cluster: tuple[Path, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay of the bundled trace takes seconds per seed: a missing matplotlib must be said first."""
    import gpupool.cli.simulate_cmd as simulate_cmd

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError

    def no_replay(*_args: object) -> None:
        raise AssertionError("simulated before checking for matplotlib")

    monkeypatch.setattr(simulate_cmd, "_job", no_replay)
    monkeypatch.setattr(simulate_cmd, "load_trace", no_replay)
    nodes, pods = small_cluster
    code, out = _simulate("--nodes", str(nodes), "--trace", str(pods), "--seeds", "1", "--jobs", "1",
                          "--plot", str(tmp_path / "curves.png"))
    assert code == 1, out
    assert "--plot needs matplotlib: pip install 'gpupool[plot]'" in out
    assert "Traceback" not in out
    assert not (tmp_path / "curves.png").exists()


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--mode", "timeline"], "--plot draws the packing experiment's curves", id="timeline"),
    pytest.param(["--tenants", "qos"], "--plot draws the packing experiment's curves", id="tenants"),
])
def test_plot_where_it_draws_nothing_is_refused(args: list[str], message: str, tmp_path: Path) -> None:
    code, out = _simulate(*args, "--plot", str(tmp_path / "curves.png"))
    assert code == 2 and message in out, out


def test_plot_into_a_missing_directory_is_refused_before_simulating(tmp_path: Path) -> None:
    code, out = _simulate("--plot", str(tmp_path / "nowhere" / "curves.png"))
    assert code == 2 and "its directory does not exist" in out, out
