"""The container directory follows the watch of the node's pods: container IDs from the pods'
statuses, pods forgotten when deleted or no longer listed, restarted containers under their new ID."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.names import ResourceNames
from gpupool.nodeagent.containers.container_directory import ContainerRef, InMemoryContainerDirectory
from gpupool.nodeagent.containers.pod_containers import DirectoryFeed, PodContainers, pod_containers
from gpupool.nodeagent.node_pod import NodePod, decode_node_pod


def raw_pod(name: str, uid: str, **containers: str) -> dict[str, Any]:
    statuses = [{"name": c, "containerID": cid} for c, cid in containers.items()]
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid},
            "status": {"initContainerStatuses": statuses[:1], "containerStatuses": statuses[1:]}}


def pod(name: str, uid: str, **containers: str) -> NodePod:
    """A pod as the agent's pod cache hands it to its feeds (decoded once)."""
    record = decode_node_pod(raw_pod(name, uid, **containers), ResourceNames())
    assert record is not None
    return record


@pytest.mark.parametrize(("obj", "expected"), [
    pytest.param(raw_pod("p", "u1", init="containerd://aa", main="cri-o://bb"),
                 PodContainers("u1", "ml", "p", {"init": "containerd://aa", "main": "cri-o://bb"}),
                 id="init-and-app-containers"),
    pytest.param({"metadata": {"name": "p", "uid": "u1"}, "status": {"containerStatuses": [{"name": "m"}]}},
                 PodContainers("u1", "default", "p", {"m": ""}), id="not-yet-created-container"),
    pytest.param({"metadata": {"name": "p"}}, None, id="no-uid"),
    pytest.param({"metadata": {"uid": "u"}, "status": {"containerStatuses": "junk"}}, None, id="no-name"),
])
def test_pod_containers(obj: dict[str, Any], expected: PodContainers | None) -> None:
    assert pod_containers(obj) == expected


def test_the_directory_follows_lists_and_events() -> None:
    directory = InMemoryContainerDirectory()
    feed = DirectoryFeed(directory)
    feed.on_list([pod("a", "ua", init="containerd://i1", main="containerd://m1"), pod("b", "ub", x="", y="docker://y1")])
    assert directory.container("m1") == ContainerRef("ml", "a", "main")
    assert directory.container("y1") == ContainerRef("ml", "b", "y")
    assert directory.pod("ub") == ("ml", "b")
    feed.on_event("MODIFIED", pod("a", "ua", init="containerd://i1", main="containerd://m2"))  # restarted
    assert directory.container("m1") is None and directory.container("m2") == ContainerRef("ml", "a", "main")
    feed.on_event("DELETED", pod("a", "ua"))
    assert directory.container("m2") is None and directory.pod("ua") is None
    feed.on_event("ADDED", pod("c", "uc", i="", main="containerd://c1"))
    feed.on_list([pod("c", "uc", i="", main="containerd://c1")])  # a re-list without b
    assert directory.pod("ub") is None and directory.container("y1") is None
    assert directory.container("c1") == ContainerRef("ml", "c", "main")
