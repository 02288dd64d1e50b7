"""HAMi's ``nvidia.com/priority`` (0 high, 1 low) read as the pod's priority at open time and for
borrowing: after gpupool's own annotation and a borrower's mark, before the PriorityClass."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.lending import Priority, borrow_refusal, hami_task_priority, pod_priority


def spec(*priorities: str | None, part: str = "limits") -> dict[str, Any]:
    return {"containers": [{"name": f"c{i}", "resources": {part: {"nvidia.com/gpu": "1"} | (
        {"nvidia.com/priority": p} if p is not None else {})}} for i, p in enumerate(priorities)]}


@pytest.mark.parametrize(("given", "expected"), [
    pytest.param(spec("0"), Priority.HIGH, id="zero-high"),
    pytest.param(spec("1"), Priority.LOW, id="one-low"),
    pytest.param(spec("1", "0"), Priority.HIGH, id="one-container-high-makes-the-pod-high"),
    pytest.param(spec("1", None), Priority.LOW, id="unsaid-containers-do-not-count"),
    pytest.param(spec("0", part="requests"), Priority.HIGH, id="requests-alone"),
    pytest.param(spec(None), None, id="none"),
    pytest.param(spec("7"), None, id="not-hamis-value"),
    pytest.param({"containers": "junk"}, None, id="malformed-spec"),
    pytest.param(None, None, id="no-spec"),
])
def test_hami_task_priority(given: Any, expected: Priority | None) -> None:
    assert hami_task_priority(given) is expected


def test_it_ranks_after_gpupools_annotation_and_before_the_priority_class() -> None:
    assert pod_priority(5000, {}, task_priority=Priority.LOW) is Priority.LOW
    assert pod_priority(None, {}, task_priority=Priority.HIGH) is Priority.HIGH
    assert pod_priority(None, {"gpupool.io/priority": "low"}, task_priority=Priority.HIGH) is Priority.LOW
    assert pod_priority(None, {"gpupool.io/borrowed": "true"}, task_priority=Priority.HIGH) is Priority.LOW


def test_a_hami_high_priority_pod_does_not_borrow() -> None:
    meta = {"annotations": {"gpupool.io/borrow": "true"}}
    assert borrow_refusal(meta, None, spec=spec("1")) is None
    refusal = borrow_refusal(meta, None, spec=spec("0"))
    assert refusal is not None and "high-priority" in refusal
