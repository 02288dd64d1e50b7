"""The pure parts of bench/e2e_scheduling.py: the objects it creates, the scheduler configuration it
writes, how it reads kube-scheduler's histograms and the extender's timings, and the double-booking
check (the run itself is tests/bench/test_e2e_scheduling_smoke.py, an e2e test)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import yaml

from bench.e2e_extender import cycle_breakdown, handler_split
from bench.e2e_kube import CRD_PATH, BoundWatch, card_overcommits, forced_watch_closes, install_crds
from bench.e2e_nodes import ready_count
from bench.e2e_objects import (
    LARGEST_SHARE,
    common_shape,
    cpu_pods,
    gpu_pods,
    node_manifest,
    node_spec,
    pod_manifest,
)
from bench.e2e_scheduler import (
    SHIPPED_CONFIG,
    SHIPPED_CONFIGS,
    histogram_delta,
    parse,
    quantile,
    scheduler_config,
)
from bench.e2e_scheduling import CRD_DIR, parser
from gpupool.api.annotations import decode_inventory
from gpupool.api.names import ResourceNames
from gpupool.kube.translate import node_spec as node_spec_from_json
from gpupool.kube.translate import pod_request

NAMES = ResourceNames()


def test_nodes_carry_inventory_resources_and_ready() -> None:
    shape = common_shape()
    manifest = node_manifest(node_spec("n1", shape), "2024-01-01T00:00:00Z")
    allocatable = manifest["status"]["allocatable"]
    assert allocatable[NAMES.gpu] == "8"
    assert allocatable[NAMES.gpu_mem] == str(8 * shape.card_mib // 256)
    assert allocatable[NAMES.gpu_core] == "800"
    assert [c["type"] for c in manifest["status"]["conditions"]] == ["Ready"]
    inventory = decode_inventory(manifest["metadata"]["annotations"][NAMES.inventory])
    assert [card.memory_mib for card in inventory.cards] == [shape.card_mib] * 8
    spec = node_spec_from_json(manifest, NAMES)
    assert (spec.cpu_milli, spec.memory_mib, len(spec.cards)) == (shape.cpu_milli, shape.memory_mib, 8)


@pytest.mark.slow
def test_pods_are_the_traces_and_at_most_half_a_node() -> None:
    shape = common_shape()
    gpu = gpu_pods(300, shape, nodes=20, seed=42)
    cpu = cpu_pods(300, shape, seed=42)
    assert len(gpu.pods) == 300 and all(p.wants_gpu for p in gpu.pods)  # more than one round of the trace
    assert len(cpu.pods) == 300 and not any(p.wants_gpu for p in cpu.pods)
    for pod in (*gpu.pods, *cpu.pods):
        assert pod.cpu_milli <= LARGEST_SHARE * shape.cpu_milli
        assert pod.memory_mib <= LARGEST_SHARE * shape.memory_mib
    manifest = pod_manifest(gpu.pods[0], "gpu-00000", "bench")
    assert manifest["metadata"]["name"] == "gpu-00000" and manifest["metadata"]["namespace"] == "bench"
    assert pod_request(manifest, NAMES).containers == gpu.pods[0].containers  # the same request read back


@pytest.mark.parametrize("mode", [pytest.param(mode, id=mode) for mode in sorted(SHIPPED_CONFIGS)])
def test_scheduler_config_is_the_shipped_one_with_the_clusters_addresses_and_limits(tmp_path: Any, mode: str) -> None:
    shipped = yaml.safe_load(SHIPPED_CONFIGS[mode].read_text())
    config = yaml.safe_load(scheduler_config(tmp_path / "kc", "http://127.0.0.1:9/x", 300.0, 600,
                                             SHIPPED_CONFIGS[mode]))
    assert config["clientConnection"] == {"kubeconfig": str(tmp_path / "kc"), "qps": 300.0, "burst": 600}
    assert config["percentageOfNodesToScore"] == shipped["percentageOfNodesToScore"] == 100
    assert config["leaderElection"] == {"leaderElect": False}
    # v1 has no insecure addresses: health and metrics are on the secure port of the command line
    assert "metricsBindAddress" not in config and "healthzBindAddress" not in config
    (extender,) = config["extenders"]
    expected = {**shipped["extenders"][0], "urlPrefix": "http://127.0.0.1:9/x"}
    expected.pop("enableHTTPS"), expected.pop("tlsConfig")  # the bench's extender speaks plain HTTP
    assert extender == expected
    assert ("prioritizeVerb" in extender) == (mode == "prioritize")


def test_the_default_mode_is_the_shipped_default_configuration() -> None:
    assert SHIPPED_CONFIGS[parser().get_default("mode")] == SHIPPED_CONFIG


METRICS = """\
# HELP scheduler_scheduling_algorithm_duration_seconds [ALPHA] Scheduling algorithm latency in seconds
# TYPE scheduler_scheduling_algorithm_duration_seconds histogram
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.001"} 10
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.002"} 30
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.004"} 40
scheduler_scheduling_algorithm_duration_seconds_bucket{le="+Inf"} 40
scheduler_scheduling_algorithm_duration_seconds_sum 0.07
scheduler_scheduling_algorithm_duration_seconds_count 40
# HELP scheduler_scheduling_attempt_duration_seconds [STABLE] Scheduling attempt latency in seconds
# TYPE scheduler_scheduling_attempt_duration_seconds histogram
scheduler_scheduling_attempt_duration_seconds_bucket{profile="default-scheduler",result="scheduled",le="0.001"} 1
scheduler_scheduling_attempt_duration_seconds_bucket{profile="default-scheduler",result="scheduled",le="+Inf"} 2
scheduler_scheduling_attempt_duration_seconds_sum{profile="default-scheduler",result="scheduled"} 0.01
scheduler_scheduling_attempt_duration_seconds_count{profile="default-scheduler",result="scheduled"} 2
scheduler_scheduling_attempt_duration_seconds_bucket{profile="default-scheduler",result="error",le="0.001"} 7
scheduler_scheduling_attempt_duration_seconds_bucket{profile="default-scheduler",result="error",le="+Inf"} 7
scheduler_scheduling_attempt_duration_seconds_sum{profile="default-scheduler",result="error"} 0.003
scheduler_scheduling_attempt_duration_seconds_count{profile="default-scheduler",result="error"} 7
# HELP scheduler_pod_scheduling_sli_duration_seconds [BETA] E2e latency for a pod being scheduled
# TYPE scheduler_pod_scheduling_sli_duration_seconds histogram
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="1",le="0.01"} 3
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="1",le="0.02"} 4
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="1",le="+Inf"} 4
scheduler_pod_scheduling_sli_duration_seconds_sum{attempts="1"} 0.03
scheduler_pod_scheduling_sli_duration_seconds_count{attempts="1"} 4
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="2",le="0.01"} 0
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="2",le="0.02"} 1
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="2",le="+Inf"} 1
scheduler_pod_scheduling_sli_duration_seconds_sum{attempts="2"} 0.015
scheduler_pod_scheduling_sli_duration_seconds_count{attempts="2"} 1
# HELP scheduler_schedule_attempts_total [ALPHA] Number of attempts to schedule pods, by the result.
# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 40
scheduler_schedule_attempts_total{profile="default-scheduler",result="error"} 7
"""


def test_histograms_are_read_and_their_quantiles_interpolated_as_prometheus_does() -> None:
    scraped = parse(METRICS)
    algorithm = scraped["scheduler_scheduling_algorithm_duration_seconds"]
    assert algorithm["count"] == 40 and algorithm["buckets"][-1] == (math.inf, 40)
    assert quantile(algorithm, 0.5) == pytest.approx(0.0015)  # 20th of 40: half-way through (1, 2] ms
    assert quantile(algorithm, 0.25) == pytest.approx(0.001)
    assert quantile(algorithm, 1.0) == pytest.approx(0.004)
    assert scraped["scheduler_scheduling_attempt_duration_seconds"]["count"] == 2  # errors left out
    sli = scraped["scheduler_pod_scheduling_sli_duration_seconds"]  # pods of every attempt count summed
    assert sli["count"] == 5 and sli["buckets"] == [(0.01, 3), (0.02, 5), (math.inf, 5)]
    assert scraped["attempts:scheduled"] == 40 and scraped["attempts:error"] == 7


def test_a_phase_sees_only_what_was_observed_during_it() -> None:
    before = parse(METRICS)
    after = parse(METRICS.replace('le="+Inf"} 40', 'le="+Inf"} 50').replace("_count 40", "_count 50"))
    delta = histogram_delta(after, before, "scheduler_scheduling_algorithm_duration_seconds")
    assert delta["count"] == 10
    assert quantile(delta, 0.5) == 0.004  # all ten above the last finite bucket: its bound
    assert quantile(histogram_delta(before, before, "scheduler_scheduling_algorithm_duration_seconds"), 0.5) is None


def _pod(node: str, cards: list[tuple[int, int, int]], bound: str | None = None) -> dict[str, Any]:
    refs = ",".join(f'{{"index":{i},"uuid":"GPU-{node}-{i}","memoryMiB":{m},"computeMilli":{c},"exclusive":false}}'
                    for i, m, c in cards)
    text = (f'{{"v":1,"node":"{node}","time":"2024-05-01T10:00:00.000000Z",'
            f'"containers":[{{"name":"main","init":false,"cards":[{refs}]}}]}}')
    return {"metadata": {"annotations": {NAMES.assignment: text}}, "spec": {"nodeName": bound or node}}


@pytest.mark.parametrize(("pods", "expected"), [
    pytest.param([_pod("n1", [(0, 8000, 500)]), _pod("n1", [(0, 8000, 500)])], (0, 0), id="card-exactly-full"),
    pytest.param([_pod("n1", [(0, 9000, 400)]), _pod("n1", [(0, 8000, 400)])], (1, 0), id="memory-over"),
    pytest.param([_pod("n1", [(0, 1000, 600)]), _pod("n1", [(0, 1000, 600)])], (1, 0), id="compute-over"),
    pytest.param([_pod("n1", [(0, 9000, 600)]), _pod("n2", [(0, 9000, 600)])], (0, 0), id="other-node"),
    pytest.param([_pod("n1", [(0, 1000, 100)], bound="n2")], (0, 1), id="assignment-for-another-node"),
])
def test_double_booking_is_counted_per_card(pods: list[dict[str, Any]], expected: tuple[int, int]) -> None:
    assert card_overcommits(pods, card_mib=16384) == expected


def test_the_cycle_is_split_between_the_extender_and_kube_scheduler() -> None:
    stamps = [("filter", 0.000, 0.002), ("prioritize", 0.005, 0.006), ("bind", 0.007, 0.020),
              ("filter", 0.010, 0.012), ("filter", 0.020, 0.021),  # one node passed: no prioritize
              ("prioritize", 0.030, 0.031)]
    parts = cycle_breakdown(stamps)
    assert parts["filter"]["mean"] == pytest.approx(1.67)  # 2, 2 and 1 ms
    assert parts["filter_to_prioritize"]["p50"] == pytest.approx(6.0)  # 3 ms and 9 ms
    assert parts["prioritize"]["p50"] == pytest.approx(1.0)
    assert parts["prioritize_to_next_filter"] == {"p50": 4.0, "mean": 4.0}
    assert parts["cycle"]["p50"] == pytest.approx(10.0)  # 10 ms and 10 ms


def test_the_loop_threads_time_is_split_into_cpu_run_queue_and_the_rest() -> None:
    # two filters: 6 ms on the wall, 2 ms on a CPU, 3 ms waiting for one, so 1 ms asleep
    split = handler_split({"filter": [0.006, 0.002, 0.003, 2], "bind": [0.0, 0.0, 0.0, 0]})
    assert split == {"filter": {"wall": 3.0, "cpu": 1.0, "run_queue": 1.5, "other": 0.5}}


def test_nodes_are_kwoks_by_default_with_a_kubelets_lease_and_bare_on_request() -> None:
    defaults = parser().parse_args([])
    assert defaults.kwok is True and defaults.lease_duration_s == 40
    assert parser().parse_args(["--no-kwok"]).kwok is False


class _TableApi:
    """The node list in the apiserver's Table form, as ``ready_count`` asks for it."""

    def __init__(self, statuses: list[str]) -> None:
        self.statuses = statuses
        self.asked: list[tuple[str, str | None]] = []

    def call(self, method: str, path: str, accept: str | None = None) -> dict[str, Any]:
        self.asked.append((path, accept))
        return {"kind": "Table", "columnDefinitions": [{"name": "Name"}, {"name": "Status"}, {"name": "Roles"}],
                "rows": [{"cells": [f"n{i}", s, "<none>"]} for i, s in enumerate(self.statuses)]}


def test_ready_nodes_are_counted_from_the_table_form_without_the_objects() -> None:
    api = _TableApi(["Ready", "NotReady", "Ready,SchedulingDisabled", "Unknown"])
    assert ready_count(api) == (2, 4)  # type: ignore[arg-type]
    ((path, accept),) = api.asked
    assert "includeObject=None" in path and accept is not None and "as=Table" in accept


class _CrdApi:
    """Records what is POSTed; a CRD reads Established from its second GET on."""

    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []
        self.gets: dict[str, int] = {}

    def call(self, method: str, path: str, body: Any = None) -> Any:
        if method == "POST":
            assert path == CRD_PATH
            self.posted.append(body)
            return body
        name = path.rsplit("/", 1)[-1]
        self.gets[name] = self.gets.get(name, 0) + 1
        status = "True" if self.gets[name] > 1 else "False"
        return {"status": {"conditions": [{"type": "NamesAccepted", "status": "True"},
                                          {"type": "Established", "status": status}]}}


def test_gpupools_crds_are_installed_from_deploy_and_waited_for_until_served() -> None:
    # without them the extender's GpuQuota and ResourceGroup watches get 404 and retry every second
    api = _CrdApi()
    files = [CRD_DIR / name for name in yaml.safe_load((CRD_DIR / "kustomization.yaml").read_text())["resources"]]
    names = install_crds(api, files)  # type: ignore[arg-type]
    assert sorted(names) == ["gpuquotas.gpupool.io", "resourcegroups.gpupool.io"]
    assert [doc["kind"] for doc in api.posted] == ["CustomResourceDefinition"] * 2
    assert api.gets == dict.fromkeys(names, 2)  # polled until Established


def test_watches_the_apiserver_cut_are_counted_by_resource_and_selector(tmp_path: Any) -> None:
    log = tmp_path / "kube-apiserver.log"
    line = ('I1128 09:29:10.199330   27512 cache_watcher.go:214] Forcing pods watcher close due to unresponsiveness: '
            'key: "/pods/", labels: "", fields: "{}". len(c.input) = 10, len(c.result) = 10, graceful = false\n')
    log.write_text(line.format("spec.nodeName!=") * 2 + line.format("") + "I1128 other line\n")
    assert forced_watch_closes(log) == {"/pods/ , fields: spec.nodeName!=": 2, "/pods/ , fields: ": 1}


def test_the_bound_watch_resumes_from_the_last_event_and_stamps_binds_and_running() -> None:
    watch = BoundWatch(None, "bench", "10")  # type: ignore[arg-type]
    watch._pod({"metadata": {"name": "a", "resourceVersion": "11"}, "spec": {}, "status": {"phase": "Pending"}})
    assert watch.version == "11" and watch.bound == {}
    watch._pod({"metadata": {"name": "a", "resourceVersion": "12"}, "spec": {"nodeName": "n1"},
                "status": {"phase": "Pending"}})
    watch._pod({"metadata": {"resourceVersion": "15"}})  # a bookmark
    watch._pod({"metadata": {"name": "a", "resourceVersion": "16"}, "spec": {"nodeName": "n1"},
                "status": {"phase": "Running"}})
    assert watch.version == "16" and watch.node == {"a": "n1"}
    assert set(watch.bound) == set(watch.running) == {"a"} and watch.running["a"] >= watch.bound["a"]
