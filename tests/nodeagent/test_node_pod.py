"""One decode of a watched pod serves every reader: the record holds the view the cache keeps and
what the lending side and the container directory read (runtime container IDs, annotations,
priorities, the controller), and a pod the view cannot be built from still names its parts."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpupool.api.annotations import Assignment, CardRef, ContainerCards, encode_assignment
from gpupool.api.lending import Priority
from gpupool.nodeagent.containers.pod_containers import PodContainers
from gpupool.nodeagent.node_pod import NodePod, UnreadablePod, decode_node_pod
from gpupool.nodeagent.pod_view import pod_view_from_json
from gpupool.nodeagent.types import PodView
from tests.nodeagent.harness import NAMES

WHEN = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def assignment_text(card: int) -> str:
    cards = (CardRef(card, f"GPU-{card}", 4096, 300),)
    return encode_assignment(Assignment("node-a", WHEN, (ContainerCards("main", cards),)))


def gpu_pod(mem: str = "4", **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ml", "uid": "u1",
                         "annotations": {NAMES.assignment: assignment_text(2), **annotations},
                         "ownerReferences": [{"kind": "Job", "uid": "job-1", "controller": True}]},
            "spec": {"nodeName": "node-a", "priority": 1000, "containers": [
                {"name": "main", "resources": {"limits": {NAMES.gpu_mem: mem, "nvidia.com/priority": "0"}}}]},
            "status": {"containerStatuses": [{"name": "main", "containerID": "containerd://abc"}]}}


def test_the_record_holds_the_view_and_what_the_feeds_read() -> None:
    pod = decode_node_pod(gpu_pod(note="x"), NAMES)
    assert pod is not None and pod.key == ("ml", "p")
    assert isinstance(pod.view, PodView) and pod.view == pod_view_from_json(gpu_pod(note="x"), NAMES)
    assert pod.assignment is not None and pod.view.assignment is pod.assignment  # one decode, shared
    assert pod.containers == PodContainers("u1", "ml", "p", {"main": "containerd://abc"})
    assert pod.annotations["note"] == "x"
    assert (pod.spec_priority, pod.task_priority, pod.controller_uid) == (1000, Priority.HIGH, "job-1")


def test_a_pod_whose_view_cannot_be_built_still_names_its_cards_and_containers() -> None:
    """A fractional device count makes the view unreadable (the cache raises it to Allocate); the
    lending side and the directory still read the assignment and container IDs, as their own
    readings of the raw pod did."""
    pod = decode_node_pod(gpu_pod(mem="1.5"), NAMES)
    assert pod is not None and isinstance(pod.view, UnreadablePod) and "whole number" in pod.view.error
    assert pod.assignment is not None and pod.containers is not None


def test_an_unreadable_assignment_is_in_the_view_not_an_error() -> None:
    pod = decode_node_pod(gpu_pod(**{NAMES.assignment: "{not json"}), NAMES)
    assert pod is not None and pod.assignment is None
    assert isinstance(pod.view, PodView) and pod.view.assignment is None and pod.view.assignment_error


def test_a_malformed_object_is_unreadable_and_skipped_by_the_feeds_never_an_error() -> None:
    """The watch thread must survive any object: the view says why, the feeds get no containers
    (they skip the pod, as their own readings that raised used to)."""
    obj = gpu_pod()
    obj["status"] = ["not", "a", "mapping"]
    pod = decode_node_pod(obj, NAMES)
    assert pod is not None and isinstance(pod.view, UnreadablePod) and pod.containers is None


def test_a_nameless_object_is_no_record() -> None:
    assert decode_node_pod({"metadata": {"uid": "u"}}, NAMES) is None


def test_a_bool_priority_and_a_missing_owner_read_as_none() -> None:
    obj = gpu_pod()
    obj["spec"]["priority"] = True
    del obj["metadata"]["ownerReferences"]
    pod = decode_node_pod(obj, NAMES)
    assert isinstance(pod, NodePod) and pod.spec_priority is None and pod.controller_uid == ""
