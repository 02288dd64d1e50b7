"""Every reason the core and the admission word comes through kube-scheduler's Go formatting as
written, whatever the cluster, the bookings and the request (hypothesis).

kube-scheduler passes the extender's reasons to ``Eventf`` as the format string (see
``tests/extender/test_reason_format.py``), so a ``%`` anywhere in a reason is garbled in ``kubectl
describe`` (``30%!c(MISSING)ompute``). The example-based tests there pin one text of each kind;
here random small clusters, random bookings and random requests (the allocation property tests'
strategies: slices, whole cards, multi-card, memory-only, compute-only, models, kinds) go through
every reason builder, and each sentence must read the same after the Go rendering.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.api.names import ResourceNames
from gpupool.core.feasibility import explain_node, request_problem, shape_problem
from gpupool.core.model import NodeSpec, PodRequest
from gpupool.core.policies import make_policy
from gpupool.core.quota import Limits, Quota, quota_verdict
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from gpupool.core.usage import Amounts
from gpupool.kube.memory_quantity import size_rewrites
from gpupool.kube.memory_units import memory_units, unit_problem
from tests.core.test_allocation_properties import node_specs, pods
from tests.extender.test_reason_format import go_sprintf_without_args
from tests.kube.builders import container, pod


def reasons(state: ClusterState, request: PodRequest) -> Iterator[str]:
    """Every sentence the filter and the admission can give for ``request`` on ``state``."""
    for problem in (request_problem(state, request), shape_problem(state, request)):
        if problem is not None:
            yield problem
    for row in range(state.size):
        problem = explain_node(state, row, request)
        if problem is not None:
            yield problem
    scheduler = Scheduler(state, make_policy("binpack"))
    rows = np.arange(state.size, dtype=np.int64)
    yield from scheduler.explain(request, rows).values()


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 3).flatmap(lambda n: st.tuples(*(node_specs(f"n{i}") for i in range(n)))),
       booked=st.lists(pods("booked"), max_size=4), asked=pods("asked"))
def test_every_filter_and_admission_reason_reads_the_same_after_go_formatting(
        nodes: tuple[NodeSpec, ...], booked: list[PodRequest], asked: PodRequest) -> None:
    state = ClusterState(list(nodes))
    scheduler = Scheduler(state, make_policy("binpack"))
    for i, request in enumerate(booked):  # books what fits: some cards shared, some exclusive, some full
        scheduler.schedule(PodRequest(f"b{i}", request.containers, request.init_containers))
    texts = list(reasons(state, asked))
    assert [t for t in texts if go_sprintf_without_args(t) != t] == []


@given(used=st.tuples(st.integers(0, 10**6), st.integers(0, 10**5), st.integers(0, 64)),
       asked=st.tuples(st.integers(0, 10**6), st.integers(0, 10**5), st.integers(0, 64)),
       hard=st.tuples(st.integers(0, 10**6), st.integers(0, 10**5), st.integers(0, 64)))
def test_every_quota_refusal_reads_the_same_after_go_formatting(
        used: tuple[int, int, int], asked: tuple[int, int, int], hard: tuple[int, int, int]) -> None:
    quota = Quota("team/gpus", "team", Limits(memory_mib=hard[0], compute=hard[1], cards=hard[2]))
    text = quota_verdict([quota], {"T4": Amounts(*used)}, {"T4": Amounts(*asked)})
    assert text is None or go_sprintf_without_args(text) == text


@given(count=st.integers(0, (1 << 63) - 1), resource=st.sampled_from(sorted(memory_units(ResourceNames()))))
def test_every_unit_refusal_reads_the_same_after_go_formatting(count: int, resource: str) -> None:
    text = unit_problem({resource: count}, memory_units(ResourceNames()))
    assert text is None or go_sprintf_without_args(text) == text


@given(number=st.integers(0, 10**6), suffix=st.sampled_from(["Ki", "Mi", "Gi", "Ti"]))
def test_every_rewrite_warning_reads_the_same_after_go_formatting(number: int, suffix: str) -> None:
    raw = pod("p", container(gpu_mem=f"{number}{suffix}"))
    for rewrite in size_rewrites(raw, ResourceNames()):
        assert go_sprintf_without_args(rewrite.warning()) == rewrite.warning()
