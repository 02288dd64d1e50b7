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


class Others:
    """Other replicas' pods still labelled (a leader SIGKILLed keeps its label), or a refusing API."""

    def __init__(self, labelled: list[str]) -> None:
        self.labelled = list(labelled)
        self.calls = 0
        self.refuse = False

    def clear(self) -> list[str]:
        self.calls += 1
        if self.refuse:
            raise RuntimeError("apiserver unavailable")
        cleared, self.labelled = self.labelled, []
        return cleared


def test_a_new_leader_takes_the_label_off_a_dead_leaders_pod() -> None:
    pod, serving, others = Pod(), [False], Others(["extender-a"])
    label = LeaderLabel(pod.patch, lambda: serving[0], unlabel_others=others.clear)
    label.sync()
    assert others.calls == 0 and others.labelled == ["extender-a"]  # a follower leaves others alone
    serving[0] = True
    assert label.sync() is True
    assert others.labelled == [] and others.calls == 1
    label.sync()
    assert others.calls == 1  # once per term of labelling, not every interval


def test_clearing_others_that_fails_is_retried_and_repeated_after_a_new_term() -> None:
    pod, serving, others = Pod(), [True], Others(["extender-a"])
    others.refuse = True
    label = LeaderLabel(pod.patch, lambda: serving[0], unlabel_others=others.clear)
    assert label.sync() is True and others.labelled == ["extender-a"]  # the failure does not stop the label
    others.refuse = False
    label.sync()
    assert others.labelled == [] and others.calls == 2
    serving[0] = False
    label.sync()
    others.labelled = ["extender-b"]  # led meanwhile and was killed
    serving[0] = True
    label.sync()
    assert others.labelled == [] and others.calls == 3


def test_the_command_clears_the_label_on_the_other_labelled_pods_of_its_namespace() -> None:
    from types import SimpleNamespace

    from gpupool.cli.extender_cmd import _leader_label

    class CoreV1:
        def __init__(self) -> None:
            self.selectors: list[str] = []
            self.patched: list[tuple[str, str, dict[str, Any]]] = []

        def list_namespaced_pod(self, namespace: str, *, label_selector: str, _request_timeout: float) -> Any:
            self.selectors.append(label_selector)
            names = ["extender-a", "extender-b"]  # b is this replica
            return SimpleNamespace(items=[SimpleNamespace(metadata=SimpleNamespace(name=n)) for n in names])

        def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any],
                                 _request_timeout: float) -> object:
            self.patched.append((namespace, name, body))
            return body

    core_v1, stop = CoreV1(), threading.Event()
    stop.set()  # no sync thread: the callable is exercised directly
    options = SimpleNamespace(leader_pod=("gpupool-system", "extender-b"),
                              lease=SimpleNamespace(commit_timeout_s=2.0))
    label = _leader_label(options, core_v1, SimpleNamespace(unready=lambda: None), stop)  # type: ignore[arg-type]
    assert label is not None and label.unlabel_others is not None
    assert label.unlabel_others() == ["extender-a"]
    assert core_v1.selectors == [f"{LEADER_LABEL}=true"]
    assert core_v1.patched == [("gpupool-system", "extender-a", {"metadata": {"labels": {LEADER_LABEL: None}}})]
