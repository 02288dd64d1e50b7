"""Leader election over a fake coordination API with the apiserver's resourceVersion rules."""

from __future__ import annotations

import copy
import time

from kubernetes.client import V1Lease
from kubernetes.client.exceptions import ApiException

from gpupool.adapters.k8s.lease import LeaderElector, LeaseSettings


class FakeCoordination:
    """One namespace of Leases; replace with a stale resourceVersion is a 409, as in the API."""

    def __init__(self) -> None:
        self.leases: dict[str, V1Lease] = {}
        self.version = 0

    def read_namespaced_lease(self, name: str, namespace: str) -> V1Lease:
        if name not in self.leases:
            raise ApiException(status=404, reason="NotFound")
        return copy.deepcopy(self.leases[name])

    def create_namespaced_lease(self, namespace: str, body: V1Lease) -> V1Lease:
        if body.metadata.name in self.leases:
            raise ApiException(status=409, reason="AlreadyExists")
        self.version += 1
        body.metadata.resource_version = str(self.version)
        self.leases[body.metadata.name] = copy.deepcopy(body)
        return body

    def replace_namespaced_lease(self, name: str, namespace: str, body: V1Lease) -> V1Lease:
        if self.leases[name].metadata.resource_version != body.metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        self.version += 1
        body.metadata.resource_version = str(self.version)
        self.leases[name] = copy.deepcopy(body)
        return body


SETTINGS = LeaseSettings(namespace="default", lease_duration=1.0, renew_deadline=0.6, retry_period=0.1)


def test_one_leader_then_takeover_after_expiry() -> None:
    api = FakeCoordination()
    started: list[str] = []
    a = LeaderElector(api, "a", SETTINGS, on_started_leading=lambda: started.append("a"))
    b = LeaderElector(api, "b", SETTINGS, on_started_leading=lambda: started.append("b"))
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.is_leader() and not b.is_leader()
    assert b.holder() == "a"
    assert a.try_acquire_or_renew()  # renewal keeps it
    time.sleep(0.7)
    assert not a.is_leader()  # past the renew deadline without renewing: stop binding
    time.sleep(0.5)  # past the lease duration: b may take over
    assert b.try_acquire_or_renew() and b.is_leader()
    assert api.leases["gpupool-extender"].spec.lease_transitions == 1
    assert not a.try_acquire_or_renew()
    assert started == ["a", "b"]


def test_two_candidates_racing_for_an_expired_lease_cannot_both_win() -> None:
    api = FakeCoordination()
    a = LeaderElector(api, "a", SETTINGS)
    assert a.try_acquire_or_renew()
    time.sleep(1.1)
    stale = api.read_namespaced_lease("gpupool-extender", "default")
    b = LeaderElector(api, "b", SETTINGS)
    c = LeaderElector(api, "c", SETTINGS)
    assert b.try_acquire_or_renew()
    original = api.read_namespaced_lease
    api.read_namespaced_lease = lambda name, namespace: copy.deepcopy(stale)  # type: ignore[method-assign]
    assert not c.try_acquire_or_renew()  # saw the expired lease too, but its update is refused
    api.read_namespaced_lease = original  # type: ignore[method-assign]
    assert api.leases["gpupool-extender"].spec.holder_identity == "b"
