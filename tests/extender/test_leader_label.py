"""The label that routes kube-scheduler to the replica that binds (gpupool/extender/leader_label.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gpupool.extender.leader_label import LEADER_LABEL, LeaderLabel, pod_ref


class Pod:
    """The replica's own pod as the API holds it: a merge patch of its labels, or a refusal."""

    def __init__(self) -> None:
        self.labels: dict[str, str] = {}
        self.patches = 0
        self.refuse = False

    def patch(self, body: dict[str, Any]) -> object:
        if self.refuse:
            raise RuntimeError("apiserver unavailable")
        self.patches += 1
        for key, value in body["metadata"]["labels"].items():
            if value is None:
                self.labels.pop(key, None)
            else:
                self.labels[key] = value
        return body


def test_the_label_follows_whether_the_replica_takes_binds() -> None:
    pod, serving = Pod(), [False]
    label = LeaderLabel(pod.patch, lambda: serving[0])
    assert label.sync() is False and pod.labels == {} and pod.patches == 1  # a stale label is taken off at start
    assert label.sync() is False and pod.patches == 1  # unchanged: no write
    serving[0] = True  # leads, term caught up
    assert label.sync() is True and pod.labels == {LEADER_LABEL: "true"}
    serving[0] = False  # lost the Lease, or a new term catching up
    assert label.sync() is False and pod.labels == {} and pod.patches == 3


def test_a_failed_patch_is_written_again_at_the_next_sync() -> None:
    pod = Pod()
    label = LeaderLabel(pod.patch, lambda: True)
    pod.refuse = True
    assert label.sync() is None and pod.labels == {}
    pod.refuse = False
    assert label.sync() is True and pod.labels == {LEADER_LABEL: "true"}


def test_a_clean_stop_takes_the_label_off() -> None:
    pod = Pod()
    label = LeaderLabel(pod.patch, lambda: True)
    label.sync()
    label.clear()
    assert pod.labels == {} and label.labelled is False


def test_the_loop_labels_a_new_leader_within_its_interval() -> None:
    pod, serving, stop = Pod(), [False], threading.Event()
    label = LeaderLabel(pod.patch, lambda: serving[0], interval_s=0.01)
    label.start(stop)
    try:
        serving[0] = True
        deadline = time.monotonic() + 5
        while pod.labels != {LEADER_LABEL: "true"}:
            assert time.monotonic() < deadline, "never labelled"
            time.sleep(0.01)
    finally:
        stop.set()


@pytest.mark.parametrize("value", ["gpupool-system", "/p", "ns/", "a/b/c", ""])
def test_a_pod_reference_must_be_namespace_slash_name(value: str) -> None:
    with pytest.raises(ValueError, match="expected NAMESPACE/NAME"):
        pod_ref(value)
    assert pod_ref("gpupool-system/gpupool-extender-7d9f") == ("gpupool-system", "gpupool-extender-7d9f")
