"""The extender's deadlines against kube-scheduler's httpTimeout (gpupool/extender/deadlines.py)."""

from __future__ import annotations

import pytest

from gpupool.extender.deadlines import deadline_problems, go_duration_s


@pytest.mark.parametrize(("text", "seconds"), [
    pytest.param("10s", 10.0, id="seconds"),
    pytest.param("1m30s", 90.0, id="minutes-and-seconds"),
    pytest.param("500ms", 0.5, id="milliseconds"),
    pytest.param("1.5s", 1.5, id="fraction"),
])
def test_go_durations_read_as_kube_scheduler_reads_them(text: str, seconds: float) -> None:
    assert go_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["10", "", "ten seconds", "5x", "-1s"])
def test_a_value_that_is_no_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        go_duration_s(text)


@pytest.mark.parametrize(("timeout", "bind", "assume", "words"), [
    pytest.param(10.0, 8.0, 12.0, [], id="shipped-values"),
    pytest.param(5.0, 8.0, 12.0, ["--bind-deadline (8 s) is not below kube-scheduler's httpTimeout (5 s)"],
                 id="bind-outlives-the-call"),
    pytest.param(15.0, 8.0, 12.0, ["--assume-deadline (12 s) is below kube-scheduler's httpTimeout (15 s)"],
                 id="assumption-lapses-first"),
])
def test_each_deadline_problem_names_both_values(timeout: float, bind: float, assume: float,
                                                 words: list[str]) -> None:
    problems = deadline_problems(timeout, bind, assume)
    assert len(problems) == len(words)
    assert all(w in p for w, p in zip(words, problems, strict=True))
