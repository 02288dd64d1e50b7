"""The in-memory container directory: containers recorded per pod and forgotten with their pod."""

from __future__ import annotations

from gpupool.nodeagent.containers.container_directory import ContainerRef, InMemoryContainerDirectory


def test_a_pod_replaced_under_the_same_name_keeps_its_containers_when_the_old_ones_delete_comes_late() -> None:
    """A StatefulSet's pod comes back with the same namespace and name and a new UID. The watch
    orders the old pod's DELETED before the new pod's ADDED, but the directory does not depend on
    that: forgetting the old pod (by its UID) never forgets the new pod's containers, which the
    monitor needs to tell whose process holds a card."""
    directory = InMemoryContainerDirectory()
    directory.add("uid-old", "ml", "db-0", {"main": "containerd://old"})
    directory.add("uid-new", "ml", "db-0", {"main": "containerd://new"})
    directory.remove_pod("uid-old")
    assert directory.container("old") is None
    assert directory.container("new") == ContainerRef("ml", "db-0", "main")
    assert directory.pod("uid-new") == ("ml", "db-0") and directory.pod("uid-old") is None


def test_forgetting_a_pod_leaves_the_others_and_an_unknown_pod_is_nothing() -> None:
    directory = InMemoryContainerDirectory()
    for i in range(3):
        directory.add(f"uid-{i}", "ml", f"p{i}", {"a": f"containerd://a{i}", "b": f"containerd://b{i}", "c": ""})
    directory.remove_pod("uid-1")
    directory.remove_pod("uid-never-seen")
    assert [directory.container(f"a{i}") is not None for i in range(3)] == [True, False, True]
    assert directory.container("b2") == ContainerRef("ml", "p2", "b")


def test_a_restarted_container_is_found_by_its_new_id_once_the_pod_is_recorded_again() -> None:
    directory = InMemoryContainerDirectory()
    directory.add("uid-1", "ml", "p", {"main": "containerd://first"})
    directory.remove_pod("uid-1")  # what the pod feed does before recording the pod again
    directory.add("uid-1", "ml", "p", {"main": "containerd://second"})
    assert directory.container("first") is None and directory.container("second") is not None
