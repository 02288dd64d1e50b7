"""The default report puts a replay in context: the paper's numbers and the size of one point."""

from __future__ import annotations

import pytest

from gpupool.sim.published import PUBLISHED_UNALLOCATED_PCT, context_lines
from gpupool.sim.trace import BUNDLED_TRACES


def test_the_default_trace_shows_the_papers_fgd_and_bestfit_and_one_point_in_gpus() -> None:
    lines = context_lines("default", 6212)
    assert lines == [
        "published at 100% arrived (Weng et al., ATC 2023, mean of seeds 42-51): fgd 4.77, bestfit 7.14",
        "one point of unallocated GPU is 62 GPUs of this cluster's 6,212",
    ]


@pytest.mark.parametrize("trace", BUNDLED_TRACES)
def test_every_bundled_trace_has_the_papers_fgd(trace: str) -> None:
    assert "fgd" in PUBLISHED_UNALLOCATED_PCT[trace]
    assert any(line.startswith("published") for line in context_lines(trace, 100))


def test_a_trace_the_paper_never_ran_shows_only_the_cluster_size() -> None:
    assert context_lines("my_pods.csv", 0) == []
    assert context_lines("my_pods.csv", 800) == ["one point of unallocated GPU is 8 GPUs of this cluster's 800"]
