"""Generated CPU-share variants: the paper's method, deterministic draws, names and errors."""

from __future__ import annotations

from collections import Counter

import pytest

from gpupool.core.model import ContainerRequest, GpuRequest, PodRequest
from gpupool.sim.trace import TraceError, TracePod, load_pods, resolve_trace
from gpupool.sim.variants import (
    DEFAULT_VARIANT_SEED,
    CpuVariant,
    cpu_share_variant,
    is_cpu_only,
    load_trace,
)


def trace_pod(key: str, cpu: int, gpu_milli: int = 0, created: int = 0) -> TracePod:
    gpu = GpuRequest.fraction(gpu_milli, 1) if gpu_milli else None
    request = PodRequest(key=key, containers=(ContainerRequest(name="main", cpu_milli=cpu, memory_mib=1, gpu=gpu),))
    return TracePod(request=request, creation_time=created, deletion_time=None)


BASE = [trace_pod(f"g{i}", 4000, 500) for i in range(6)] + [trace_pod(f"c{i}", 1000 * (i + 1), created=i)
                                                            for i in range(3)]


def cpu_only(pods: list[TracePod]) -> list[TracePod]:
    return [p for p in pods if is_cpu_only(p.request)]


@pytest.mark.parametrize(("name", "expected"), [
    pytest.param("cpu250", CpuVariant(0.25, DEFAULT_VARIANT_SEED), id="paper-naming-per-mille"),
    pytest.param("cpu050", CpuVariant(0.05), id="bundled-name-still-parses"),
    pytest.param("cpu200@7", CpuVariant(0.2, 7), id="explicit-draw-seed"),
    pytest.param("cpu000", CpuVariant(0.0), id="no-cpu-only-pods"),
    pytest.param("cpu25", None, id="needs-three-digits"),
    pytest.param("default", None, id="other-name"),
    pytest.param("cpu250@x", None, id="bad-seed-is-not-a-variant"),
])
def test_parse_names(name: str, expected: CpuVariant | None) -> None:
    assert CpuVariant.parse(name) == expected


def test_share_of_one_is_refused() -> None:
    with pytest.raises(TraceError, match="no bundled trace or file named 'cpu1000'"):
        load_trace("cpu1000")
    with pytest.raises(TraceError, match=r"in \[0, 1\)"):
        cpu_share_variant(BASE, 1.0, 0)


@pytest.mark.parametrize(("share", "cpu_pods"), [
    pytest.param(0.0, 0, id="none"),
    pytest.param(0.25, 2, id="subsample-below-base-share"),
    pytest.param(0.5, 6, id="draws-with-replacement-above"),
])
def test_variant_keeps_gpu_pods_and_reaches_the_share(share: float, cpu_pods: int) -> None:
    variant = cpu_share_variant(BASE, share, seed=1)
    assert [p for p in variant if not is_cpu_only(p.request)] == BASE[:6]
    drawn = cpu_only(variant)
    assert len(drawn) == cpu_pods
    assert len({p.request.key for p in variant}) == len(variant)
    base_shapes = {(p.request.containers, p.creation_time) for p in cpu_only(BASE)}
    assert all((p.request.containers, p.creation_time) in base_shapes for p in drawn)
    if cpu_pods <= 3:  # a subsample: no pod twice
        assert len({p.creation_time for p in drawn}) == cpu_pods


def test_variant_is_deterministic_by_seed() -> None:
    def draw(seed: int) -> list[int]:
        return [p.request.cpu_milli for p in cpu_only(cpu_share_variant(BASE, 0.6, seed))]

    assert draw(3) == draw(3)
    assert any(draw(3) != draw(s) for s in range(4, 10))


def test_draw_does_not_depend_on_the_base_order() -> None:
    forward = cpu_only(cpu_share_variant(BASE, 0.5, 2))
    backward = cpu_only(cpu_share_variant(list(reversed(BASE)), 0.5, 2))
    assert forward == backward


def test_bases_without_the_needed_pods_are_refused() -> None:
    with pytest.raises(TraceError, match="with GPU pods"):
        cpu_share_variant(cpu_only(BASE), 0.5, 0)
    with pytest.raises(TraceError, match="CPU-only pods to draw from"):
        cpu_share_variant(BASE[:6], 0.5, 0)


@pytest.mark.slow
def test_load_trace_builds_variants_from_the_default_trace() -> None:
    default = load_pods(resolve_trace("default"))
    gpu_pods = [p for p in default if not is_cpu_only(p.request)]
    variant = load_trace("cpu250")
    drawn = cpu_only(variant)
    assert len(drawn) / len(variant) == pytest.approx(0.25, abs=1e-3)
    assert variant[len(drawn):] == gpu_pods
    assert Counter(p.request.cpu_milli for p in drawn).keys() <= {p.request.cpu_milli for p in cpu_only(default)}
    assert load_trace("cpu250") == variant
    assert load_trace("cpu250@1") != variant


def test_load_trace_prefers_bundled_files_and_reads_paths() -> None:
    assert load_trace("cpu050") == load_pods(resolve_trace("cpu050"))
    with pytest.raises(TraceError, match="no bundled trace or file named 'nope'"):
        load_trace("nope")
