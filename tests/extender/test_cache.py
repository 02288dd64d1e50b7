"""The watch cache: node lists (a re-list that brings new nodes adds them in one go and books the
pods that were waiting for them), and the CPU and memory of every bound pod, GPUs or not."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpupool.api.names import ResourceNames
from gpupool.extender import cache as cache_module
from gpupool.extender.bookings import Stage
from gpupool.extender.cache import ClusterCache
from gpupool.extender.pod_records import read_pod
from gpupool.extender.request_memo import RequestMemo
from gpupool.extender.watch import apply_pod_event
from gpupool.kube.listwatch import ListWatch
from gpupool.kube.pod_holding import PodRecord
from gpupool.kube.translate import pod_request
from gpupool.testing.fake_api import FakePodApi
from gpupool.testing.fake_watch import FakeListWatch
from tests.kube.builders import container, node, placed_pod, pod


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


def test_a_list_of_the_same_object_versions_translates_nothing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A catch-up list of a view that is already current only compares versions."""
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("n1", [16276])])
    a, b = placed_pod("a", "n1", 0, 4000), placed_pod("b", "n1", 0, 2000)
    a["metadata"]["resourceVersion"], b["metadata"]["resourceVersion"] = "7", "8"
    cache.replace_pods([a, b])
    translated: list[str] = []

    def counting(raw: dict[str, Any], names: ResourceNames, memo: RequestMemo | None = None) -> PodRecord | None:
        translated.append(raw["metadata"]["name"])
        return read_pod(raw, names, memo)

    monkeypatch.setattr(cache_module, "read_pod", counting)
    moved = placed_pod("b", "n1", 0, 6000)
    moved["metadata"]["resourceVersion"] = "9"
    cache.replace_pods([a, moved])
    assert translated == ["b"]  # only the pod whose version moved
    assert free_mib(cache, "n1") == [6276]


# --------------------------------------------------------------------------- CPU and memory
class Watched:
    """A cache fed by the list+watch loop from the in-process fake API, as in a cluster."""

    def __init__(self) -> None:
        self.api = FakePodApi()
        self.server = FakeListWatch(self.api)
        self.cache = ClusterCache(policy="binpack")
        self.cache.replace_nodes([node("n1", [16276]), node("cpu-only")])
        self.stop = threading.Event()
        self.watch = ListWatch("pods", self.server.list_pod_for_all_namespaces, self.cache.replace_pods,
                               lambda kind, obj: apply_pod_event(self.cache, kind, obj), stop=self.stop,
                               watch_timeout_s=1, backoff_s=0.05)

    def free(self, name: str) -> tuple[int, int]:
        row = self.cache.state.index[name]
        return int(self.cache.state.cpu_free[row]), int(self.cache.state.mem_free[row])


@pytest.fixture
def watched() -> Iterator[Watched]:
    w = Watched()
    w.watch.start()
    yield w
    w.stop.set()
    w.server.hold_watches()
    w.server.release_watches()
    w.watch.thread.join(timeout=10)


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


NODE_FREE = (32_000, 128 * 1024)  # the builders' nodes: 32 CPUs, 128 GiB


@pytest.mark.parametrize("end", [
    pytest.param(lambda api: api.delete_pod("default", "web"), id="deleted"),
    pytest.param(lambda api: api.set_pod_phase("default", "web", "Succeeded"), id="succeeded"),
    pytest.param(lambda api: api.set_pod_phase("default", "web", "Failed"), id="failed"),
])
@pytest.mark.parametrize("where", ["n1", "cpu-only"])
def test_a_pod_without_gpus_bound_by_kube_scheduler_holds_its_cpu_and_memory_until_it_ends(
        watched: Watched, where: str, end: Callable[[FakePodApi], None]) -> None:
    """The policies' CPU-GPU balance and FGD's CPU check read the ledger's free CPU: pods without
    GPUs, which kube-scheduler binds without asking the extender, must count there too."""
    eventually(lambda: watched.cache.synced)
    watched.api.create_pod(pod("web", container(cpu="3", memory="6Gi")))
    watched.api.bind_pod("default", "web", "", where)  # kube-scheduler's Binding, no extender involved
    eventually(lambda: watched.free(where) == (NODE_FREE[0] - 3_000, NODE_FREE[1] - 6 * 1024))
    assert watched.cache.bookings["default/web"].stage is Stage.BOUND
    end(watched.api)
    eventually(lambda: watched.free(where) == NODE_FREE)
    assert "default/web" not in watched.cache.state.placements


def test_a_gpu_pods_booking_holds_its_cpu_and_memory_too() -> None:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("n1", [16276])])
    placed = placed_pod("a", "n1", 0, 4000)
    placed["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "4", "memory": "2Gi"}
    cache.replace_pods([placed, pod("pending-cpu", container(cpu="8"))])
    row = cache.state.index["n1"]
    assert (int(cache.state.cpu_free[row]), int(cache.state.mem_free[row])) == (28_000, 126 * 1024)
    assert free_mib(cache, "n1") == [12276]
    request = pod_request(pod("b", container(mib=1000, cpu="30")), cache.names)
    assert "insufficient CPU: 30000m requested, 28000m free" in str(cache.reserve(request, "n1"))
