"""The watch cache's node lists: a re-list that brings new nodes adds them in one go and books the
pods that were waiting for them."""

from __future__ import annotations

from gpupool.extender.cache import ClusterCache
from tests.kube.builders import node, placed_pod


def free_mib(cache: ClusterCache, name: str) -> list[int]:
    return [u.memory_free for u in cache.state.card_usage(name)]


def test_a_relist_adds_new_nodes_and_books_the_pods_waiting_for_them() -> None:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("n1", [16276]), node("gone", [16276])])
    cache.replace_pods([placed_pod("a", "n1", 0, 4000), placed_pod("b", "n2", 0, 8000),
                        placed_pod("c", "n4", 1, 1000)])
    assert free_mib(cache, "n1") == [12276]
    assert "default/b" not in cache.state.placements  # n2 is not known yet: the booking waits

    # after a 410 the node list comes again: n2 and n4 are new, n3 is broken, "gone" has gone
    broken = node("n3", annotations={"gpupool.io/inventory-v1": "{"})
    cache.replace_nodes([node("n1", [16276]), node("n2", [16276]), broken, node("n4", [16276, 16276])])

    assert free_mib(cache, "n1") == [12276]
    assert free_mib(cache, "n2") == [8276]
    assert free_mib(cache, "n4") == [16276, 15276]
    assert "n3" in cache.node_problems
    assert not cache.state.present[cache.state.index["gone"]]
    assert cache.state.size == 5
    assert not cache.conflicts


def test_a_list_of_the_same_object_versions_translates_nothing_again() -> None:
    """A catch-up list of a view that is already current only compares versions."""
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("n1", [16276])])
    a, b = placed_pod("a", "n1", 0, 4000), placed_pod("b", "n1", 0, 2000)
    a["metadata"]["resourceVersion"], b["metadata"]["resourceVersion"] = "7", "8"
    cache.replace_pods([a, b])
    translated: list[str] = []
    record = cache._record
    cache._record = lambda raw: (translated.append(raw["metadata"]["name"]), record(raw))[1]  # type: ignore[method-assign]
    moved = placed_pod("b", "n1", 0, 6000)
    moved["metadata"]["resourceVersion"] = "9"
    cache.replace_pods([a, moved])
    assert translated == ["b"]  # only the pod whose version moved
    assert free_mib(cache, "n1") == [6276]
