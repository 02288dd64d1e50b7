"""bench/e2e_scheduling.py at a tiny size against the real control plane and KWOK's nodes (e2e): it
keeps working.

Asserts what every run must show (every pod bound and, on KWOK's nodes, Running; no card booked
twice; no failed bind; the keys the docs quote); no timing: the figures are measurements, not test
outcomes.
"""

from __future__ import annotations

import pytest

from bench.e2e_scheduling import main, measure, parser
from gpupool.testenv.build import build_impossible_reason

pytestmark = pytest.mark.e2e

TOP_LEVEL_KEYS = {
    "gpu_pods_per_s", "cpu_pods_per_s", "gpu_to_cpu", "extender_cpu_ms_per_gpu_pod", "p99_latency_ms",
    "p99_scheduling_sli_ms", "nodes", "gpu_pods", "cpu_pods", "gpu_bound", "cpu_bound", "running",
    "double_booked_cards", "wrong_assignments", "failed_binds", "extender_bind_errors", "kwok", "node_timings_s",
    "scheduler_qps", "scheduler_burst", "kube_scheduler_series", "load_average_1m_start", "load_average_1m_end",
    "phases",
}
PHASE_KEYS = {"pods_per_s", "bound", "seconds", "created_to_bound_ms", "bound_to_running_ms", "kube_scheduler",
              "extender_ms", "cpu_s", "cycle_ms"}
HISTOGRAMS = {"scheduling_algorithm_duration", "scheduling_attempt_duration", "pod_scheduling_sli_duration"}


@pytest.fixture(scope="module", params=[pytest.param("prioritize", id="prioritize"),
                                        pytest.param("best-only", id="best-only")])
def result(request: pytest.FixtureRequest) -> dict[str, object]:
    """One run per shipped configuration: filter, prioritize and bind; or (with the extender's
    --filter-best-only) filter and bind."""
    reason = build_impossible_reason()
    if reason is not None:
        pytest.skip(f"gpupool testenv cannot be built here: {reason}")
    opts = parser().parse_args(["--nodes", "20", "--gpu-pods", "40", "--cpu-pods", "40", "--timeout", "120",
                                "--mode", request.param])
    found: dict[str, object] = measure(opts)
    return found


def test_every_pod_is_bound_runs_and_no_card_is_booked_twice(result: dict[str, object]) -> None:
    assert (result["gpu_bound"], result["cpu_bound"]) == (40, 40)
    assert result["double_booked_cards"] == 0 and result["wrong_assignments"] == 0
    assert result["failed_binds"] == 0 and result["extender_bind_errors"] == 0
    assert result["kwok"] is True and result["running"] == 80  # KWOK's nodes: every bound pod Running
    assert set(result["crds"]) == {"gpuquotas.gpupool.io", "resourcegroups.gpupool.io"}  # installed as deploy/ does


def test_the_json_carries_what_the_docs_quote(result: dict[str, object]) -> None:
    assert set(result) >= TOP_LEVEL_KEYS
    phases = result["phases"]
    assert isinstance(phases, dict)
    gpu, cpu = phases["gpu"], phases["cpu"]
    assert set(gpu) >= PHASE_KEYS and set(cpu) >= PHASE_KEYS
    # kube-scheduler counted every pod, and only GPU pods reached the extender
    assert gpu["kube_scheduler"]["attempts"]["scheduled"] == 40
    assert set(gpu["kube_scheduler"]) >= HISTOGRAMS  # the series the current kube-scheduler exposes
    for name in HISTOGRAMS:
        assert gpu["kube_scheduler"][name]["count"] == 40, name
    assert gpu["extender_ms"]["bind"]["count"] == 40 and gpu["extender_ms"]["filter"]["count"] == 40
    assert cpu["kube_scheduler"]["attempts"]["scheduled"] == 40
    assert cpu["extender_ms"] == {}
    # kube-scheduler calls prioritize only when its configuration names the verb
    assert ("prioritize" in gpu["extender_ms"]) == (result["mode"] == "prioritize")


def test_the_command_line_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    if build_impossible_reason() is not None:
        pytest.skip("gpupool testenv cannot be built here")
    # the bare-Node mode (no KWOK: nodes created Ready, pods stay Pending after their bind) still runs
    assert main(["--nodes", "4", "--gpu-pods", "4", "--cpu-pods", "4", "--timeout", "120", "--no-kwok", "--json"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("{") and '"gpu_pods_per_s"' in last
