"""The reclaim's eviction: no grace period (the pod's processes are already stopped), so the pod
object, and its booking on the loan in the extender's ledger, goes at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpupool.api.lending import LendingNames
from gpupool.nodeagent.lending.kube_io import KubeLending


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class RecordingApi:
    """CoreV1Api's eviction and delete, answering each eviction with the next status (None: 201)."""

    def __init__(self, eviction_answers: list[int | None]) -> None:
        self.answers = list(eviction_answers)
        self.evictions: list[dict[str, Any]] = []
        self.deletes: list[dict[str, Any]] = []

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.evictions.append(body)
        status = self.answers.pop(0)
        if status is not None:
            raise ApiError(status)

    def delete_namespaced_pod(self, name: str, namespace: str, **options: Any) -> None:
        self.deletes.append(options)


def lending_io(api: RecordingApi) -> KubeLending:
    io = KubeLending.__new__(KubeLending)  # no kubeconfig: the API is the recording stand-in
    io._api, io._error, io.node, io.names = api, ApiError, "n1", LendingNames()
    return io


@pytest.mark.parametrize(("answers", "outcome", "evictions", "deleted"), [
    pytest.param([None], "evicted", 1, False, id="evicted"),
    pytest.param([404, None], "evicted", 2, False, id="older-api-server-policy-v1beta1"),
    pytest.param([429], "deleted", 1, True, id="budget-refuses-then-deleted"),
])
def test_a_reclaimed_pod_is_evicted_or_deleted_without_a_grace_period(
    answers: list[int | None], outcome: str, evictions: int, deleted: bool,
) -> None:
    api = RecordingApi(answers)
    assert asyncio.run(lending_io(api).evict("team", "borrower")) == outcome
    assert len(api.evictions) == evictions
    assert all(body["deleteOptions"] == {"gracePeriodSeconds": 0} for body in api.evictions)
    assert api.deletes == ([{"grace_period_seconds": 0}] if deleted else [])
