"""The PodResources client paces its Lists at kubelet's rate limit and shares a List that waits for
its token: a List sent after a caller began shows that caller everything it needs, so the pod
workers' PreStartContainer calls of a batch, which used to take a token each (and be refused past
kubelet's burst, then retried after 10, 20, 40 ... ms), take one together."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gpupool.nodeagent.deviceplugin.api import podres_pb
from gpupool.nodeagent.deviceplugin.call_pacing import CallPacer
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_pacer_lets_the_burst_through_then_one_call_per_token() -> None:
    clock = Clock()
    pacer = CallPacer(100.0, 10, clock=clock)
    assert [pacer.reserve() for _ in range(10)] == [0.0] * 10
    assert pacer.reserve() == pytest.approx(0.01)  # the 11th waits for the next token ...
    assert pacer.reserve() == pytest.approx(0.02)  # ... and the 12th for the one after (reserved in order)
    clock.now += 0.02
    assert pacer.reserve() == pytest.approx(0.01)
    clock.now += 10.0
    assert [pacer.reserve() for _ in range(10)] == [0.0] * 10  # never more than the burst saved


def test_a_refusal_empties_the_pacers_bucket() -> None:
    clock = Clock()
    pacer = CallPacer(100.0, 10, clock=clock)
    pacer.refused()  # another client drew kubelet's tokens
    assert pacer.reserve() == pytest.approx(0.01)


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 10), (-1.0, 10), (100.0, 0)])
def test_a_pacer_without_a_positive_rate_or_burst_is_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="positive rate"):
        CallPacer(rate, burst)


class FakeLists:
    """Stands in for kubelet's List: counts the calls sent, answers each with the pods present when
    it was sent, and holds each answer until released."""

    def __init__(self) -> None:
        self.sent = 0
        self.pods: list[str] = []
        self.release = asyncio.Event()
        self.fail_next: grpc.StatusCode | None = None

    async def __call__(self, request: podres_pb.ListPodResourcesRequest) -> podres_pb.ListPodResourcesResponse:
        self.sent += 1
        present = list(self.pods)
        await self.release.wait()
        if self.fail_next is not None:
            code, self.fail_next = self.fail_next, None
            raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "stand-in refusal")
        return podres_pb.ListPodResourcesResponse(pod_resources=[
            podres_pb.PodResources(name=n, namespace="default") for n in present])


def paced_client(lists: FakeLists, clock: Clock | None = None) -> PodResourcesClient:
    """A client whose bucket is empty, so each List waits ~10 ms for its token: callers can join."""
    pacer = CallPacer(100.0, 1)
    pacer.reserve()
    client = PodResourcesClient("/nonexistent/podres.sock", pacer=pacer)
    client._list_once = lists  # type: ignore[method-assign]
    return client


def test_callers_that_ask_while_a_list_waits_for_its_token_share_it() -> None:
    async def main() -> None:
        lists = FakeLists()
        lists.release.set()
        client = paced_client(lists)
        lists.pods = ["a"]
        answers = await asyncio.gather(*(client.list() for _ in range(5)))
        assert lists.sent == 1
        assert all(answer == {("default", "a"): {}} for answer in answers)
    asyncio.run(main())


def test_a_caller_that_asks_after_the_list_was_sent_gets_a_later_one() -> None:
    """The first List was sent before pod b was admitted; a caller asking after that must see b."""
    async def main() -> None:
        lists = FakeLists()
        client = paced_client(lists)
        first = asyncio.create_task(client.list())
        while lists.sent == 0:  # the first List has been sent (it waits for its answer)
            await asyncio.sleep(0.001)
        lists.pods = ["b"]
        second = asyncio.create_task(client.list())
        await asyncio.sleep(0.05)
        lists.release.set()
        assert await first == {}
        assert await second == {("default", "b"): {}}
        assert lists.sent == 2
    asyncio.run(main())


def test_a_caller_that_gives_up_leaves_the_shared_list_to_the_others() -> None:
    """GetPreferredAllocation reads with a deadline: its cancellation must not cancel the List an
    Allocate waits for."""
    async def main() -> None:
        lists = FakeLists()
        client = paced_client(lists)
        lists.pods = ["a"]
        impatient = asyncio.create_task(client.list())
        patient = asyncio.create_task(client.list())
        await asyncio.sleep(0)
        impatient.cancel()
        lists.release.set()
        assert await patient == {("default", "a"): {}}
        assert impatient.cancelled() and lists.sent == 1
    asyncio.run(main())


def test_a_failed_list_is_not_handed_to_later_callers() -> None:
    async def main() -> None:
        lists = FakeLists()
        lists.release.set()
        lists.fail_next = grpc.StatusCode.INTERNAL
        client = paced_client(lists)
        with pytest.raises(grpc.aio.AioRpcError):
            await client.list()
        lists.pods = ["a"]
        assert await client.list() == {("default", "a"): {}}
        assert lists.sent == 2
    asyncio.run(main())
