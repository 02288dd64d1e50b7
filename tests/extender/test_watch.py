"""The list+watch loop against the in-process fake API: events, resume, and a re-list on 410 Gone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from gpupool.extender.cache import ClusterCache
from gpupool.extender.watch import apply_pod_event
from gpupool.kube.listwatch import ListWatch
from gpupool.testing.fake_api import FakePodApi
from gpupool.testing.fake_watch import FakeListWatch
from tests.kube.builders import container, node, pod


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


class World:
    def __init__(self) -> None:
        self.api = FakePodApi()
        self.server = FakeListWatch(self.api)
        self.cache = ClusterCache(policy="binpack")
        self.cache.replace_nodes([node("n1", [16276])])
        self.stop = threading.Event()
        self.watch = ListWatch("pods", self.server.list_pod_for_all_namespaces, self.cache.replace_pods,
                               lambda kind, obj: apply_pod_event(self.cache, kind, obj), stop=self.stop,
                               page_size=2, watch_timeout_s=1, backoff_s=0.05)

    def create(self, name: str) -> None:
        self.api.create_pod(pod(name, container(mib=1000)))

    def known(self) -> set[str]:
        return set(self.cache.pods)


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.stop.set()
    w.server.hold_watches()  # end the open stream now rather than at its timeout
    w.server.release_watches()
    w.watch.thread.join(timeout=10)
    assert not w.watch.thread.is_alive()


def test_list_then_watch_applies_every_event(world: World) -> None:
    for name in ("p1", "p2", "p3"):
        world.create(name)
    world.watch.start()
    eventually(lambda: world.cache.synced and world.known() == {"default/p1", "default/p2", "default/p3"})
    assert world.server.lists == 2  # three pods in pages of two
    world.create("p4")
    world.api.delete_pod("default", "p1")
    eventually(lambda: world.known() == {"default/p2", "default/p3", "default/p4"})
    assert world.watch.relists == 1
    assert world.watch.resource_version == str(world.api.resource_version)


def test_a_watch_that_ends_resumes_from_the_last_version_without_listing(world: World) -> None:
    world.create("p1")
    world.watch.start()
    eventually(lambda: world.known() == {"default/p1"})
    world.server.hold_watches()  # the stream ends, as at a server-side timeout
    world.create("p2")
    world.server.release_watches()
    eventually(lambda: world.known() == {"default/p1", "default/p2"})
    assert world.watch.relists == 1


def test_410_gone_in_the_stream_lists_again_and_catches_up(world: World) -> None:
    """Events lost while disconnected (a delete among them) can only be recovered by a new list."""
    for name in ("p1", "p2"):
        world.create(name)
    world.watch.start()
    eventually(lambda: world.known() == {"default/p1", "default/p2"})
    world.server.hold_watches()
    world.api.delete_pod("default", "p1")
    world.create("p3")
    world.api.compact()  # the watcher's resourceVersion is now too old: 410 Gone
    world.server.release_watches()
    eventually(lambda: world.watch.relists == 2)
    eventually(lambda: world.known() == {"default/p2", "default/p3"})
    world.create("p4")  # and it watches on from the new list's version
    eventually(lambda: "default/p4" in world.known())
    assert world.watch.relists == 2


def test_410_as_an_http_error_lists_again_too(world: World) -> None:
    world.create("p1")
    world.watch.start()
    eventually(lambda: world.known() == {"default/p1"})
    world.server.hold_watches()
    world.server.fail_next_watch(410)
    world.create("p2")
    world.server.release_watches()
    eventually(lambda: world.watch.relists == 2 and world.known() == {"default/p1", "default/p2"})


def test_other_watch_errors_back_off_and_resume_without_listing(world: World) -> None:
    world.create("p1")
    world.watch.start()
    eventually(lambda: world.known() == {"default/p1"})
    world.server.hold_watches()
    world.server.fail_next_watch(500)
    world.create("p2")
    world.server.release_watches()
    eventually(lambda: world.known() == {"default/p1", "default/p2"})
    assert world.watch.relists == 1


def test_catch_up_lists_what_a_lagging_watch_has_not_delivered_and_drops_its_older_events(
        world: World) -> None:
    """A new leader's catch-up: the quorum list is applied at once, and the events the lagging
    stream still carries (all at or before the list's version) never overwrite it."""
    applied: list[int] = []
    on_event = world.watch.on_event
    world.watch.on_event = lambda kind, obj: (applied.append(int(obj["metadata"]["resourceVersion"])),
                                              on_event(kind, obj))[1]
    world.create("p1")
    world.watch.start()
    eventually(lambda: world.known() == {"default/p1"})
    world.server.hold_watches()  # the watch lags: nothing more arrives for now
    world.create("p2")
    world.api.delete_pod("default", "p1")
    version = world.watch.catch_up()
    assert version == str(world.api.resource_version)
    assert world.known() == {"default/p2"} and world.watch.catch_ups == 1
    applied.clear()
    world.server.release_watches()  # the stream resumes from before the list...
    world.create("p3")
    eventually(lambda: world.known() == {"default/p2", "default/p3"})
    assert applied and min(applied) > int(version)  # ...but only newer events are applied
    assert world.watch.relists == 1  # no 410, no re-list of the watch loop's own


def test_catch_up_applies_nothing_when_the_watch_is_already_there(world: World) -> None:
    world.create("p1")
    world.watch.start()
    eventually(lambda: world.watch.resource_version == str(world.api.resource_version))
    assert world.watch.catch_up() == str(world.api.resource_version)
    assert world.watch.catch_ups == 0 and world.known() == {"default/p1"}
