"""The node agent's heartbeat Lease: created once, renewed with one request, recovered after 404/409."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from kubernetes.client import V1Lease
from kubernetes.client.exceptions import ApiException

from gpupool.api.agent_lease import LEASE_COMPONENT, LEASE_LABEL
from gpupool.nodeagent.heartbeat import AgentHeartbeat, HeartbeatSettings
from tests.extender.lease_fakes import FakeClock, FakeCoordination


class CountingCoordination(FakeCoordination):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.fail: int | None = None

    def read_namespaced_lease(self, name: str, namespace: str) -> V1Lease:
        self.calls.append("get")
        return super().read_namespaced_lease(name, namespace)

    def create_namespaced_lease(self, namespace: str, body: V1Lease) -> V1Lease:
        self.calls.append("create")
        return super().create_namespaced_lease(namespace, body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: V1Lease) -> V1Lease:
        self.calls.append("update")
        if self.fail is not None:
            raise ApiException(status=self.fail, reason="injected")
        if name not in self.leases:
            raise ApiException(status=404, reason="NotFound")
        return copy.deepcopy(super().replace_namespaced_lease(name, namespace, body))


def beat(api: Any, clock: FakeClock) -> AgentHeartbeat:
    return AgentHeartbeat(api, "n1", HeartbeatSettings("gpupool", duration_s=40, renew_interval_s=10),
                          wall=clock.wall)


def test_the_first_beat_creates_the_lease_and_later_ones_replace_it_in_one_request() -> None:
    api, clock = CountingCoordination(), FakeClock()
    heartbeat = beat(api, clock)
    heartbeat.renew_once()
    lease = api.leases["gpupool-agent-n1"]
    assert lease.spec.holder_identity == "n1" and lease.spec.lease_duration_seconds == 40
    assert lease.metadata.labels == {LEASE_LABEL: LEASE_COMPONENT}
    first = lease.spec.renew_time
    clock.advance(10)
    heartbeat.renew_once()
    heartbeat.renew_once()
    assert api.calls == ["get", "create", "update", "update"]
    assert api.leases["gpupool-agent-n1"].spec.renew_time > first
    assert api.leases["gpupool-agent-n1"].spec.acquire_time == lease.spec.acquire_time


@pytest.mark.parametrize(("status", "after"), [
    pytest.param(409, ["get", "update"], id="conflict-reads-again"),
    pytest.param(404, ["get", "create"], id="deleted-creates-again"),
])
def test_a_refused_renewal_reads_the_lease_afresh(status: int, after: list[str]) -> None:
    api, clock = CountingCoordination(), FakeClock()
    heartbeat = beat(api, clock)
    heartbeat.renew_once()
    api.fail = status
    with pytest.raises(ApiException):
        heartbeat.renew_once()
    api.fail = None
    if status == 404:
        del api.leases["gpupool-agent-n1"]
    api.calls.clear()
    heartbeat.renew_once()
    assert api.calls == after


def test_a_lease_taken_over_by_someone_else_is_written_back_to_this_node() -> None:
    api, clock = CountingCoordination(), FakeClock()
    heartbeat = beat(api, clock)
    heartbeat.renew_once()
    api.leases["gpupool-agent-n1"].spec.holder_identity = "intruder"
    api.leases["gpupool-agent-n1"].metadata.labels = {"other": "x"}
    heartbeat._last = None
    heartbeat.renew_once()
    lease = api.leases["gpupool-agent-n1"]
    assert lease.spec.holder_identity == "n1" and lease.metadata.labels[LEASE_LABEL] == LEASE_COMPONENT


def test_run_keeps_renewing_through_failures() -> None:
    api, clock = CountingCoordination(), FakeClock()
    heartbeat = AgentHeartbeat(api, "n1", HeartbeatSettings("gpupool", duration_s=2, renew_interval_s=0.04),
                               wall=clock.wall)

    async def main() -> None:
        task = asyncio.create_task(heartbeat.run())
        await asyncio.sleep(0.1)
        api.fail = 500
        await asyncio.sleep(0.05)
        api.fail = None
        await asyncio.sleep(0.1)
        task.cancel()

    asyncio.run(main())
    assert heartbeat.stats.failures >= 1 and heartbeat.stats.renewals >= 3


@pytest.mark.parametrize(("duration", "interval"), [
    pytest.param(0, 1.0, id="zero-duration"),
    pytest.param(10, 0.0, id="zero-interval"),
    pytest.param(10, 10.0, id="interval-not-shorter-than-duration"),
])
def test_settings_that_would_lapse_between_renewals_are_refused(duration: int, interval: float) -> None:
    with pytest.raises(ValueError):
        HeartbeatSettings(duration_s=duration, renew_interval_s=interval)


def test_no_lease_is_renewed_while_kubelet_has_not_accepted_the_device_plugins() -> None:
    """A live Lease tells the extender the node serves GPU pods; an agent kubelet never registered
    (a wrong --plugin-dir) kept renewing it, and pods placed there ran with no GPU grant."""
    api, clock = CountingCoordination(), FakeClock()
    heartbeat = AgentHeartbeat(api, "n1", HeartbeatSettings("gpupool", duration_s=2, renew_interval_s=0.02),
                               wall=clock.wall)

    async def main() -> None:
        served = asyncio.Event()
        task = asyncio.create_task(heartbeat.run(served=served))
        await asyncio.sleep(0.1)
        assert api.calls == [] and heartbeat.stats.renewals == 0  # not registered: nothing written
        served.set()
        await asyncio.sleep(0.1)
        assert heartbeat.stats.renewals >= 2
        served.clear()  # kubelet restarted: renewals stop until the plugins are registered again
        await asyncio.sleep(0.05)
        stopped_at = heartbeat.stats.renewals
        await asyncio.sleep(0.1)
        assert heartbeat.stats.renewals == stopped_at
        task.cancel()

    asyncio.run(main())
