"""The node agent's pod cache against the in-process fake list+watch: the store follows the
events, 410 Gone and errors are survived, and a pod is read from the API only as the last resort."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpupool.api.annotations import Assignment, CardRef, ContainerCards, decode_assignment, encode_assignment
from gpupool.api.lending import LendingNames
from gpupool.api.names import ResourceNames
from gpupool.kube.listwatch import Backoff
from gpupool.kube.podapi import NotFoundError
from gpupool.nodeagent import assignment_codec
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.containers.pod_containers import DirectoryFeed
from gpupool.nodeagent.lending.pods import LendingPods
from gpupool.nodeagent.node_pod import NodePod, decode_node_pod
from gpupool.nodeagent.pod_cache import NodePodCache
from gpupool.testing.fake_api import FakePodApi
from gpupool.testing.fake_watch import FakeListWatch
from tests.nodeagent.harness import NAMES

NODE = "node-a"
#: Long enough that a test finding a pod by waiting proves the wait ended on the pod's event.
SLOW_ARRIVAL_S = 5.0


WHEN = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def pod(name: str, node: str | None = NODE, mem: str = "4") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": {NAMES.gpu_mem: mem}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


@dataclass
class World:
    api: FakePodApi
    server: FakeListWatch
    cache: NodePodCache
    now: list[float]
    reads: list[tuple[str, str]] = field(default_factory=list)
    read_fetched: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a read has its answer from the API (held back while :attr:`answer_reads` is clear)."""
    answer_reads: asyncio.Event = field(default_factory=asyncio.Event)

    def gets(self) -> list[str]:
        """The API GETs the cache made (the fake records every call)."""
        return [c for c in self.api.calls if c.startswith("get ")]


async def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def watched(*pods: dict[str, Any], arrival_wait_s: float = SLOW_ARRIVAL_S,
                  list_pods: Callable[[FakeListWatch], Any] | None = None,
                  late_reads: bool = False) -> AsyncIterator[World]:
    """The cache running over a fake API holding ``pods``; synced before the test body runs.
    ``late_reads``: each API read's answer reaches the cache only once ``answer_reads`` is set."""
    api = FakePodApi()
    for p in pods:
        api.create_pod(p)
    server = FakeListWatch(api, poll_s=0.01)
    now = [1000.0]
    reads: list[tuple[str, str]] = []
    fetched, answer = asyncio.Event(), asyncio.Event()
    if not late_reads:
        answer.set()

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        reads.append((namespace, name))
        try:
            found: dict[str, Any] | None = await asyncio.to_thread(api.get_pod, namespace, name)
        except NotFoundError:
            found = None
        fetched.set()
        await answer.wait()
        return found

    lister = list_pods(server) if list_pods else server.list_pod_for_all_namespaces
    cache = NodePodCache(NODE, NAMES, lister, read, arrival_wait_s=arrival_wait_s,
                         backoff=Backoff(0.01, 0.05), watch_timeout_s=1, clock=lambda: now[0])
    task = asyncio.create_task(cache.run())
    try:
        assert await cache.wait_synced(10), "the cache never synced"
        yield World(api, server, cache, now, reads, fetched, answer)
    finally:
        await stop(task, cache, server)


async def stop(task: asyncio.Task[None], cache: NodePodCache, server: FakeListWatch) -> None:
    """Cancel the cache's run and end its watch thread (the open stream ended now, not at its timeout)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await asyncio.to_thread(server.hold_watches)
    server.release_watches()
    assert cache.watch is not None
    await asyncio.to_thread(cache.watch.thread.join, 10)
    assert not cache.watch.thread.is_alive()


def cached(world: World) -> set[str]:
    return {name for name in ("p1", "p2", "p3", "p4", "p9") if world.cache.cached("default", name)}


def test_lists_this_nodes_pods_from_the_apiservers_watch_cache() -> None:
    async def main() -> None:
        async with watched(pod("p1"), pod("p2", node="node-b"), pod("p3", node=None)) as world:
            assert cached(world) == {"p1"}
            assert world.server.list_versions == ["0"]  # resourceVersion=0: not an etcd scan
            view = await world.cache.get("default", "p1")
            assert view is not None and view.node == NODE and view.containers[0].limits == {NAMES.gpu_mem: 4}
            assert world.cache.stats.hits == 1 and world.gets() == []

    asyncio.run(main())


def test_added_modified_and_deleted_events_reach_the_store_without_reads() -> None:
    async def main() -> None:
        async with watched(pod("p1"), pod("p2", node=None), arrival_wait_s=0.1) as world:
            world.api.create_pod(pod("p3"))  # ADDED on this node
            world.api.bind_pod("default", "p2", "", NODE)  # bound: starts matching the selector
            await eventually(lambda: cached(world) == {"p1", "p2", "p3"})
            rv = world.api.list_pods()[0]["metadata"]["resourceVersion"]
            world.api.patch_pod_annotations("default", "p1", rv, {NAMES.assignment: "{"})
            await eventually(lambda: bool((v := world.cache.cached("default", "p1")) and v.assignment_error))
            world.api.delete_pod("default", "p3")
            await eventually(lambda: cached(world) == {"p1", "p2"})
            assert await world.cache.get("default", "p2") is not None
            assert await world.cache.get("default", "p3") is None  # the watch said it is gone: no read
            assert world.cache.stats.absent == 1
            assert world.gets() == [] and world.reads == []

    asyncio.run(main())


def test_410_gone_lists_again_and_recovers_what_the_watch_missed() -> None:
    async def main() -> None:
        async with watched(pod("p1"), pod("p2"), arrival_wait_s=0.1) as world:
            await asyncio.to_thread(world.server.hold_watches)  # disconnected while...
            world.api.delete_pod("default", "p1")
            world.api.create_pod(pod("p3"))
            world.api.compact()  # ...etcd compacts the events away
            world.server.release_watches()
            await eventually(lambda: cached(world) == {"p2", "p3"})
            assert world.cache.stats.lists == 2 and world.server.lists == 2
            assert await world.cache.get("default", "p1") is None  # missing from the new list: gone
            assert world.reads == []

    asyncio.run(main())


def test_list_and_watch_errors_back_off_and_resume() -> None:
    async def main() -> None:
        api_errors = 3

        def failing_lister(server: FakeListWatch) -> Any:
            server.fail_next_lists(500, times=api_errors)
            return server.list_pod_for_all_namespaces

        async with watched(pod("p1"), list_pods=failing_lister) as world:
            assert world.cache.watch is not None
            assert world.cache.watch.failures == api_errors and cached(world) == {"p1"}
            await asyncio.to_thread(world.server.hold_watches)
            world.server.fail_next_watch(503)
            world.api.create_pod(pod("p2"))
            world.server.release_watches()
            await eventually(lambda: cached(world) == {"p1", "p2"})
            assert world.cache.watch.failures == api_errors + 1
            assert world.cache.stats.lists == 1  # an error is not a 410: the watch resumed, no re-list

    asyncio.run(main())


def test_a_pod_bound_after_allocate_started_is_served_when_its_event_arrives() -> None:
    async def main() -> None:
        async with watched(pod("p1")) as world:
            await asyncio.to_thread(world.server.hold_watches)  # the watch trails kubelet's
            started = time.monotonic()
            allocate = asyncio.create_task(world.cache.get("default", "p9"))
            await asyncio.sleep(0.1)
            assert not allocate.done()  # waiting on the store, not reading the API
            world.api.create_pod(pod("p9"))
            world.server.release_watches()
            view = await allocate
            assert view is not None and view.name == "p9"
            assert time.monotonic() - started < SLOW_ARRIVAL_S / 2  # woken by the event, not the bound
            assert world.cache.stats.waited == 1 and world.reads == [] and world.gets() == []

    asyncio.run(main())


def test_a_pod_the_watch_does_not_bring_in_time_is_read_once_as_the_last_resort() -> None:
    async def main() -> None:
        async with watched(pod("p1"), arrival_wait_s=0.1) as world:
            await asyncio.to_thread(world.server.hold_watches)  # the watch is stuck
            world.api.create_pod(pod("p9"))
            view = await world.cache.get("default", "p9")
            assert view is not None and view.name == "p9"
            assert world.cache.stats.fallback_reads == 1 and world.gets() == ["get default/p9"]
            world.server.release_watches()

    asyncio.run(main())


def test_a_pod_missing_from_the_api_is_read_again_only_after_the_ttl() -> None:
    async def main() -> None:
        async with watched(pod("p1"), arrival_wait_s=0.05) as world:
            assert await world.cache.get("default", "ghost") is None  # kubelet lists it, the API not
            assert await world.cache.get("default", "ghost") is None
            assert world.reads == [("default", "ghost")] and world.cache.stats.absent == 1
            world.now[0] += 31.0
            assert await world.cache.get("default", "ghost") is None
            assert world.reads == [("default", "ghost")] * 2

    asyncio.run(main())


def test_a_pod_recreated_under_a_deleted_name_is_found_by_waiting() -> None:
    """A StatefulSet's pod comes back with its name: the deletion memo must not hide it."""
    async def main() -> None:
        async with watched(pod("p1")) as world:
            world.api.delete_pod("default", "p1")
            await eventually(lambda: cached(world) == set())
            await asyncio.to_thread(world.server.hold_watches)
            allocate = asyncio.create_task(world.cache.get("default", "p1"))
            await asyncio.sleep(0.1)
            world.api.create_pod(pod("p1", mem="8"))
            world.server.release_watches()
            view = await allocate
            assert view is not None and view.containers[0].limits == {NAMES.gpu_mem: 8}
            assert world.reads == []

    asyncio.run(main())


def test_an_unreadable_pod_fails_its_own_reads_and_nothing_else() -> None:
    async def main() -> None:
        async with watched(pod("p1", mem="1.5"), pod("p2")) as world:
            with pytest.raises(ValueError, match=r"default/p1 cannot be read.*whole number"):
                await world.cache.get("default", "p1")
            assert await world.cache.get("default", "p2") is not None
            world.api.create_pod(pod("p3"))  # the watch goes on
            await eventually(lambda: world.cache.cached("default", "p3") is not None)
            assert world.reads == []

    asyncio.run(main())


def test_a_pod_of_another_node_is_never_kept_even_if_the_server_ignores_the_selector() -> None:
    def selector_ignored(server: FakeListWatch) -> Any:
        def list_pods(*, field_selector: str | None = None, **kwargs: Any) -> Any:
            return server.list_pod_for_all_namespaces(**kwargs)
        return list_pods

    async def main() -> None:
        async with watched(pod("p1"), pod("p2", node="node-b"), list_pods=selector_ignored) as world:
            world.api.create_pod(pod("p3", node="node-b"))
            world.api.create_pod(pod("p4"))
            await eventually(lambda: cached(world) == {"p1", "p4"})
            assert world.cache.stats.events >= 1 and cached(world) == {"p1", "p4"}

    asyncio.run(main())


def test_the_fake_list_watch_refuses_a_selector_it_does_not_implement() -> None:
    server = FakeListWatch(FakePodApi())
    with pytest.raises(ValueError, match=r"spec\.nodeName=<node>"):
        server.list_pod_for_all_namespaces(field_selector="status.phase=Running")


class RecordingFeed:
    """A pod feed that records what the watch hands it; ``fail`` makes every call raise."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[tuple[str, tuple[str, ...]]] = []
        self.records: list[NodePod] = []

    def on_list(self, pods: Iterable[NodePod]) -> None:
        if self.fail:
            raise RuntimeError("feed bug")
        listed = list(pods)
        self.records.extend(listed)
        self.seen.append(("LIST", tuple(sorted(p.name for p in listed))))

    def on_event(self, kind: str, pod: NodePod) -> None:
        if self.fail:
            raise RuntimeError("feed bug")
        self.records.append(pod)
        self.seen.append((kind, (pod.name,)))


def test_feeds_see_this_nodes_decoded_pods_and_a_failing_feed_stops_nothing() -> None:
    """The lending side and the usage monitor's container directory are fed from the same watch,
    with the record the cache decoded; a pod moving to another node reaches the feed as deleted."""
    async def main() -> None:
        feed, broken = RecordingFeed(), RecordingFeed(fail=True)
        async with watched(pod("p1"), pod("p2", node="node-b"), arrival_wait_s=0.1) as world:
            world.cache.feeds[:] = [broken, feed]
            world.api.create_pod(pod("p3"))
            await eventually(lambda: ("ADDED", ("p3",)) in feed.seen)
            world.api.delete_pod("default", "p3")
            await eventually(lambda: ("DELETED", ("p3",)) in feed.seen)
            assert cached(world) == {"p1"}
            assert all(isinstance(r, NodePod) for r in feed.records)

    asyncio.run(main())


def gpu_pod(name: str, card: int) -> dict[str, Any]:
    """A pod of this node with an ``assignment-v1`` on ``card``, a UID and a created container."""
    obj = pod(name)
    obj["metadata"]["uid"] = f"uid-{name}"
    obj["metadata"]["annotations"] = {NAMES.assignment: encode_assignment(Assignment(NODE, WHEN, (ContainerCards(
        "main", (CardRef(card, f"GPU-{card}", 4096, 300),)),)))}
    obj["status"] = {"containerStatuses": [{"name": "main", "containerID": f"containerd://id-{name}"}]}
    return obj


def test_each_pod_event_is_decoded_once_for_the_store_and_every_feed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store, the lending side's pods and the container directory all read one decode of each
    list entry and event: the decoder runs once per pod per list or event, and ``assignment-v1`` is
    decoded once (the feeds used to read the raw pod again, the lending side decoding the
    assignment a second time)."""
    decodes: list[str] = []
    assignment_decodes: list[str] = []

    def counting_decode_assignment(text: str) -> Any:
        assignment_decodes.append(text)
        return decode_assignment(text)

    # every node-side decode of assignment-v1 goes through assignment_codec.node_assignment
    monkeypatch.setattr(assignment_codec, "decode_assignment", counting_decode_assignment)

    def counting_decode(obj: Mapping[str, Any], names: ResourceNames) -> NodePod | None:
        decodes.append(obj["metadata"]["name"])
        return decode_node_pod(obj, names)

    async def main() -> None:
        api = FakePodApi()
        api.create_pod(gpu_pod("p1", 0))
        server = FakeListWatch(api, poll_s=0.01)

        async def read(namespace: str, name: str) -> dict[str, Any] | None:
            raise AssertionError("no API read expected")

        cache = NodePodCache(NODE, NAMES, server.list_pod_for_all_namespaces, read, backoff=Backoff(0.01, 0.05),
                             watch_timeout_s=1, decode=counting_decode)
        lending, directory = LendingPods(LendingNames(NAMES.domain)), InMemoryContainerDirectory()
        cache.feeds[:] = [lending, DirectoryFeed(directory)]
        task = asyncio.create_task(cache.run())
        try:
            assert await cache.wait_synced(10)
            await eventually(lambda: lending.get(("default", "p1")) is not None)
            assert decodes == ["p1"] and len(assignment_decodes) == 1
            api.create_pod(gpu_pod("p2", 1))
            await eventually(lambda: cache.cached("default", "p2") is not None)
            await eventually(lambda: lending.get(("default", "p2")) is not None)
            assert decodes == ["p1", "p2"] and len(assignment_decodes) == 2
            found = lending.get(("default", "p2"))
            assert found is not None and found.cards == {"main": (1,)} and found.container_ids == {"main": "id-p2"}
            assert directory.pod("uid-p2") == ("default", "p2") and directory.container("id-p2") is not None
            view = cache.cached("default", "p2")
            assert view is not None and view.assignment is not None
            assert [s.card for c in view.assignment.placement.containers for s in c.slices] == [1]
        finally:
            await stop(task, cache, server)

    asyncio.run(main())


LEND = LendingNames(NAMES.domain)


def replacement(name: str, controller_uid: str = "rs-uid", **annotations: str) -> dict[str, Any]:
    """A ReplicaSet's pod of this node (its controller named in ``ownerReferences``)."""
    obj = pod(name)
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train",
                                           "uid": controller_uid, "controller": True}]
    obj["metadata"]["annotations"] = dict(annotations)
    return obj


def test_a_pod_only_the_api_read_found_reaches_the_feeds_as_a_watch_event_would() -> None:
    """The watch never brings the pod; the last-resort read does, and the lending side (checkpoint
    key, borrower mark), the other feeds and the store get that pod decoded as the watch would have
    decoded it (issue 26: the lending side used to never see it, and keyed its checkpoint directory
    by namespace/name)."""
    async def main() -> None:
        async with watched(pod("p1"), arrival_wait_s=0.1) as world:
            lending, feed = LendingPods(LEND), RecordingFeed()
            world.cache.feeds[:] = [lending, feed]
            await asyncio.to_thread(world.server.hold_watches)  # the watch is stuck
            world.api.create_pod(replacement("p9", **{LEND.borrowed: "true", LEND.borrowed_from: "default/owner"}))
            view = await world.cache.get("default", "p9")
            assert view is not None and view.name == "p9"
            known = lending.get(("default", "p9"))
            assert known is not None and known.checkpoint_key == "rs-uid" and known.borrowed
            assert feed.seen == [("ADDED", ("p9",))] and feed.records[0].view == view
            assert world.cache.cached("default", "p9") == view
            assert await world.cache.get("default", "p9") == view  # from the store now: no second read
            assert world.reads == [("default", "p9")]
            stats = world.cache.stats
            assert (stats.fallback_reads, stats.reads_handed_on, stats.hits) == (1, 1, 1)
            world.server.release_watches()  # the watch catches up: its event replaces the read's
            await eventually(lambda: ("ADDED", ("p9",)) in feed.seen[1:])
            assert lending.get(("default", "p9")) is not None and world.cache.cached("default", "p9") is not None

    asyncio.run(main())


@pytest.mark.parametrize("watch_says", ["deleted", "modified"])
def test_a_late_read_never_overrides_what_the_watch_said_meanwhile(watch_says: str) -> None:
    """The read has its answer, the watch then delivers the pod and its deletion (or a newer version)
    before that answer arrives: the read's pod is not handed on, so a deleted pod is not brought
    back and a newer version is not replaced by an older one."""
    async def main() -> None:
        async with watched(pod("p1"), arrival_wait_s=0.1, late_reads=True) as world:
            lending, feed = LendingPods(LEND), RecordingFeed()
            world.cache.feeds[:] = [lending, feed]
            await asyncio.to_thread(world.server.hold_watches)
            world.api.create_pod(replacement("p9", **{LEND.checkpoint_key: "old"}))
            allocate = asyncio.create_task(world.cache.get("default", "p9"))
            await world.read_fetched.wait()  # the API answered with the pod; the answer is on its way
            if watch_says == "deleted":
                world.api.delete_pod("default", "p9")
            else:
                rv = world.api.get_pod("default", "p9")["metadata"]["resourceVersion"]
                world.api.patch_pod_annotations("default", "p9", rv, {LEND.checkpoint_key: "new"})
            world.server.release_watches()
            last = ("DELETED", ("p9",)) if watch_says == "deleted" else ("MODIFIED", ("p9",))
            await eventually(lambda: last in feed.seen)
            await eventually(lambda: world.cache.stats.events >= 2)  # both events applied to the store
            world.answer_reads.set()
            assert await allocate is not None  # the caller still gets what the API said
            known, stored = lending.get(("default", "p9")), world.cache.cached("default", "p9")
            if watch_says == "deleted":
                assert known is None and stored is None
                assert await world.cache.get("default", "p9") is None  # gone, without another read
            else:
                assert known is not None and known.checkpoint_key == "new"
                assert stored is not None
            assert feed.seen == [("ADDED", ("p9",)), last]  # only the watch's word
            assert world.cache.stats.reads_handed_on == 0 and world.reads == [("default", "p9")]

    asyncio.run(main())


def test_a_read_spoken_over_by_a_relist_is_not_handed_on() -> None:
    """A list while the read is in flight cannot say whether the pod was deleted after the read:
    the read is dropped and the list stands."""
    async def main() -> None:
        async with watched(pod("p1"), arrival_wait_s=0.1, late_reads=True) as world:
            feed = RecordingFeed()
            world.cache.feeds[:] = [feed]
            await asyncio.to_thread(world.server.hold_watches)
            world.api.create_pod(pod("p9"))
            allocate = asyncio.create_task(world.cache.get("default", "p9"))
            await world.read_fetched.wait()
            world.api.delete_pod("default", "p9")
            world.api.compact()  # the watch must list again, and the new list lacks p9
            world.server.release_watches()
            await eventually(lambda: ("LIST", ("p1",)) in feed.seen)
            world.answer_reads.set()
            assert await allocate is not None
            assert world.cache.cached("default", "p9") is None and [kind for kind, _ in feed.seen] == ["LIST"]
            assert world.cache.stats.reads_handed_on == 0

    asyncio.run(main())


def test_an_unreadable_pod_read_from_the_api_fails_as_from_the_watch_and_is_kept() -> None:
    """The read is decoded as an event is: a pod whose limits cannot be read fails this read and the
    next (from the store, without a second GET), and still reaches the feeds with its identity."""
    async def main() -> None:
        async with watched(pod("p1"), arrival_wait_s=0.1) as world:
            feed = RecordingFeed()
            world.cache.feeds[:] = [feed]
            await asyncio.to_thread(world.server.hold_watches)
            world.api.create_pod(pod("p9", mem="1.5"))
            for _ in range(2):
                with pytest.raises(ValueError, match=r"default/p9 cannot be read.*whole number"):
                    await world.cache.get("default", "p9")
            assert world.reads == [("default", "p9")] and feed.seen == [("ADDED", ("p9",))]
            world.server.release_watches()

    asyncio.run(main())
