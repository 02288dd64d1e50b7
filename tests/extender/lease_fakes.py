"""A fake coordination API with the apiserver's resourceVersion rules, and a clock tests move by hand."""

from __future__ import annotations

import copy
import datetime as dt

from kubernetes.client import V1Lease
from kubernetes.client.exceptions import ApiException


class FakeCoordination:
    """One namespace of Leases; replace with a stale resourceVersion is a 409, as in the API."""

    def __init__(self) -> None:
        self.leases: dict[str, V1Lease] = {}
        self.version = 0
        self.timeouts: set[object] = set()
        """Every ``_request_timeout`` a call was given (None: a call without one)."""

    def read_namespaced_lease(self, name: str, namespace: str, **kwargs: object) -> V1Lease:
        self.timeouts.add(kwargs.get("_request_timeout"))
        if name not in self.leases:
            raise ApiException(status=404, reason="NotFound")
        return copy.deepcopy(self.leases[name])

    def create_namespaced_lease(self, namespace: str, body: V1Lease, **kwargs: object) -> V1Lease:
        self.timeouts.add(kwargs.get("_request_timeout"))
        if body.metadata.name in self.leases:
            raise ApiException(status=409, reason="AlreadyExists")
        self.version += 1
        body.metadata.resource_version = str(self.version)
        self.leases[body.metadata.name] = copy.deepcopy(body)
        return body

    def replace_namespaced_lease(self, name: str, namespace: str, body: V1Lease, **kwargs: object) -> V1Lease:
        self.timeouts.add(kwargs.get("_request_timeout"))
        if self.leases[name].metadata.resource_version != body.metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        self.version += 1
        body.metadata.resource_version = str(self.version)
        self.leases[name] = copy.deepcopy(body)
        return body


class FakeClock:
    """Monotonic seconds and a wall clock that only move when a test says so (shared by replicas)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.now, dt.UTC)

    def advance(self, seconds: float) -> None:
        self.now += seconds
