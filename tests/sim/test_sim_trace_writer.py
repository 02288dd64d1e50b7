"""The trace writer: live requests in the trace's terms, and rows the trace reader reads back."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gpupool.core.model import ContainerRequest, GpuCard, GpuKind, GpuRequest, NodeSpec, PodRequest
from gpupool.sim.trace import load_nodes, load_pods
from gpupool.sim.trace_writer import (
    NODE_COLUMNS,
    POD_COLUMNS,
    PodTimes,
    TraceGpu,
    TraceShapeError,
    node_row,
    pod_row,
    trace_gpu,
    write_rows,
)

CARD = 16_384


def pod(*gpus: GpuRequest | None, init: GpuRequest | None = None) -> PodRequest:
    containers = tuple(ContainerRequest(f"c{i}", cpu_milli=500, memory_mib=256, gpu=g) for i, g in enumerate(gpus))
    inits = (ContainerRequest("init", cpu_milli=2_000, memory_mib=128, gpu=init),) if init else ()
    return PodRequest(key="ns/p", containers=containers, init_containers=inits)


@pytest.mark.parametrize(("request_", "expected"), [
    pytest.param(pod(None), None, id="cpu-only"),
    pytest.param(pod(GpuRequest.whole(2)), TraceGpu(2, 1000), id="whole-cards"),
    pytest.param(pod(GpuRequest(compute=300, memory_mib=None)), TraceGpu(1, 300), id="trace-style-fraction"),
    pytest.param(pod(GpuRequest(compute=100, memory_mib=4_096)), TraceGpu(1, 250), id="memory-share-dominates"),
    pytest.param(pod(GpuRequest(compute=600, memory_mib=4_096)), TraceGpu(1, 600), id="compute-dominates"),
    pytest.param(pod(GpuRequest(compute=0, memory_mib=1_000)), TraceGpu(1, 62), id="memory-only-rounds-up"),
    pytest.param(pod(GpuRequest(count=2, compute=0, memory_mib=0, memory_share=400)), TraceGpu(2, 400),
                 id="hami-percentage"),
    pytest.param(pod(GpuRequest(compute=300, memory_mib=None, models=frozenset({"B", "A"}))),
                 TraceGpu(1, 300, frozenset({"A", "B"})), id="models"),
    pytest.param(pod(GpuRequest(compute=200, memory_mib=None), init=GpuRequest.whole()), TraceGpu(1, 200),
                 id="init-gpu-left-out"),
])
def test_requests_in_the_traces_terms(request_: PodRequest, expected: TraceGpu | None) -> None:
    assert trace_gpu(request_, CARD) == expected


@pytest.mark.parametrize(("request_", "card", "message"), [
    pytest.param(pod(GpuRequest.whole(), GpuRequest.whole()), CARD, "2 containers ask for GPUs",
                 id="two-gpu-containers"),
    pytest.param(pod(None, init=GpuRequest.whole()), CARD, "only an init container", id="init-only"),
    pytest.param(pod(GpuRequest(compute=300, memory_mib=None, kind=GpuKind.VIRTUAL)), CARD, "virtual cards only",
                 id="card-kind"),
    pytest.param(pod(GpuRequest(compute=0, memory_mib=1_024)), 0, "no card of the cluster", id="no-card-memory"),
])
def test_requests_the_trace_cannot_hold_are_refused_with_the_reason(request_: PodRequest, card: int,
                                                                     message: str) -> None:
    with pytest.raises(TraceShapeError, match=message):
        trace_gpu(request_, card)


def test_rows_read_back_as_the_same_cluster_and_pods(tmp_path: Path) -> None:
    cards = tuple(GpuCard(i, f"GPU-{i}", "NVIDIA-H200", 143_771) for i in range(8))
    nodes = [NodeSpec("gpu-a", 96_000, 1_000_000, cards), NodeSpec("cpu-b", 16_000, 64_000, ())]
    nodes_csv = tmp_path / "nodes.csv"
    with nodes_csv.open("w") as handle:
        assert write_rows(handle, NODE_COLUMNS, [node_row(n) for n in nodes]) == 2
    read = load_nodes(nodes_csv)
    assert [(n.name, n.cpu_milli, n.memory_mib, len(n.cards)) for n in read] == [
        ("gpu-a", 96_000, 1_000_000, 8), ("cpu-b", 16_000, 64_000, 0)]
    assert {(c.model, c.memory_mib) for c in read[0].cards} == {("NVIDIA-H200", 143_771)}  # not the 16 GiB default

    request = pod(GpuRequest(compute=100, memory_mib=4_096, models=frozenset({"NVIDIA-H200"})))
    pods_csv = tmp_path / "pods.csv"
    buffer = io.StringIO()
    times = PodTimes("Running", "Burstable", 7, 9)
    write_rows(buffer, POD_COLUMNS, [pod_row(request, trace_gpu(request, CARD), times)])
    pods_csv.write_text(buffer.getvalue())
    (back,) = load_pods(pods_csv)
    assert back.request.key == "ns/p" and back.creation_time == 7 and back.deletion_time is None
    assert back.qos == "Burstable"
    (container,) = back.request.containers
    assert (container.cpu_milli, container.memory_mib) == (500, 256)
    assert container.gpu == GpuRequest.fraction(250, 1, frozenset({"NVIDIA-H200"}))


def test_a_negative_card_memory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model,gpu_memory_mib\nn,1000,1000,1,T4,-5\n")
    with pytest.raises(ValueError, match="'gpu_memory_mib' must not be negative"):
        load_nodes(path)
