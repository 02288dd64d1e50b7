"""The lendable annotation: at most one write per interval, withdrawals at once."""

from __future__ import annotations

import asyncio

import pytest

from gpupool.api.lending import LendableCard, decode_lendable
from gpupool.nodeagent.lending.publisher import LendablePublisher

A = LendableCard(0, "GPU-0", "ns/a", "c", 4096, 100, 1.0)
B = LendableCard(1, "GPU-1", "ns/b", "c", 4096, 100, 1.0)


def test_additions_wait_for_the_interval_and_withdrawals_do_not() -> None:
    now = [100.0]
    writes: list[str | None] = []

    async def write(value: str | None) -> None:
        writes.append(value)

    publisher = LendablePublisher(write, min_interval_s=2.0, clock=lambda: now[0])
    assert publisher.due_in() == 0.0  # the first publication (clears a stale annotation)

    async def body() -> None:
        await publisher.publish_now()
        publisher.offer([A])
        assert publisher.due_in() == 2.0
        now[0] += 2.0
        assert publisher.due_in() == 0.0
        await publisher.publish_now()
        publisher.offer([A, B])
        assert publisher.due_in() == 2.0
        publisher.offer([B])  # A withdrawn: now
        assert publisher.due_in() == 0.0
        await publisher.publish_now()
        publisher.offer([B])
        assert publisher.due_in() == float("inf")

    asyncio.run(body())
    assert writes[0] is None and [c.index for c in decode_lendable(writes[-1] or "").cards] == [1]


@pytest.mark.slow
def test_the_loop_retries_a_failed_write() -> None:
    calls: list[str | None] = []

    async def flaky(value: str | None) -> None:
        calls.append(value)
        if len(calls) == 1:
            raise RuntimeError("apiserver away")

    async def body() -> None:
        publisher = LendablePublisher(flaky, min_interval_s=0)
        publisher.offer([A])
        task = asyncio.create_task(publisher.run())
        for _ in range(40):
            await asyncio.sleep(0.05)
            if publisher.writes:
                break
        task.cancel()
        assert publisher.writes == 1

    asyncio.run(body())
    assert len(calls) == 2


def test_a_cancel_that_arrives_as_the_publisher_is_woken_stops_it() -> None:
    """The agent stops its loops by cancelling them. Python 3.11's ``asyncio.wait_for`` returned the
    woken event's result instead of raising a cancellation that arrived in the same turn of the
    loop, so a loop waiting that way ran on and the agent's stop hung (seen in the remote-GPU
    agent's e2e test). The publisher's wait must give the cancellation up."""
    async def main() -> bool:
        async def write(value: str | None) -> None:
            return None

        publisher = LendablePublisher(write, min_interval_s=60)
        task = asyncio.create_task(publisher.run())
        for _ in range(5):  # the first (empty) publication
            await asyncio.sleep(0)
        publisher.offer([A])  # an addition: it waits for the interval
        for _ in range(5):
            await asyncio.sleep(0)
        assert publisher.writes == 1 and 0 < publisher.due_in() < float("inf")
        asyncio.get_running_loop().call_soon(lambda: (publisher._wake.set(), task.cancel()))
        await asyncio.wait({task}, timeout=2)
        return task.cancelled()

    assert asyncio.run(main())
