"""GpuQuota status: used and hard per dimension and per model, written by the leader only, only
when changed, at most a bounded number per pass."""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from gpupool.api.quota import decode_quota
from gpupool.api.quota_status import quota_status
from gpupool.core.model import Placement
from gpupool.core.usage import Amounts
from gpupool.extender.cache import ClusterCache
from gpupool.extender.quota_status import QuotaStatusWriter
from tests.extender.tenancy_world import gpu_pod, quota, read, world
from tests.kube.builders import node

CARD = 16_384
NODES = [node("v", [CARD, CARD], model="V100"), node("t", [CARD, CARD], model="T4")]


def test_status_shows_used_in_every_dimension_and_hard_where_limited_per_model() -> None:
    found = quota_status(decode_quota(quota("team-a", hard={"wholeGpus": 2}, models={"T4": {"computePercent": 50}})),
                         {"V100": Amounts(CARD, 1000, 1), "T4": Amounts(4096, 25, 0)})
    assert found == {
        "hard": {"wholeGpus": 2},
        "used": {"memoryMiB": CARD + 4096, "computePercent": 102.5, "wholeGpus": 1},
        "models": {"T4": {"used": {"memoryMiB": 4096, "computePercent": 2.5, "wholeGpus": 0},
                          "hard": {"computePercent": 50}},
                   "V100": {"used": {"memoryMiB": CARD, "computePercent": 100, "wholeGpus": 1}}}}


def test_an_unreadable_quota_shows_its_problem_and_limits_of_zero() -> None:
    cache = world(NODES, quotas=[quota("team-a", models={"": {"wholeGpus": 1}})])
    writer = QuotaStatusWriter(cache, None, lambda: True)
    (change,) = writer.pending()
    assert change.status["hard"] == {"memoryMiB": 0, "computePercent": 0, "wholeGpus": 0}
    assert "empty GPU model name" in change.status["problem"]


class FakeCustomApi:
    """Records status patches; echoes nothing back (as a watch that has not delivered yet)."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, str, Any]] = []

    def patch_namespaced_custom_object_status(self, group: str, version: str, namespace: str, plural: str,
                                              name: str, body: Any, **kwargs: Any) -> None:
        assert (group, version, plural) == ("gpupool.io", "v1alpha1", "gpuquotas")
        assert kwargs["_content_type"] == "application/json-patch+json"
        self.patches.append((namespace, name, body))


def hold(cache: ClusterCache, name: str, ns: str, **limits: int) -> None:
    request, tenant = read(cache, gpu_pod(name, ns, **limits))
    assert isinstance(cache.reserve(request, "v", tenant), Placement)


def seen(cache: ClusterCache, api: FakeCustomApi) -> None:
    """The watch delivering the written statuses back."""
    with cache.lock:
        for namespace, name, body in api.patches:
            cache.tenancy.upsert_quota({**quota(namespace, name, hard={"wholeGpus": 2}), "status": body[0]["value"]})


def test_the_leader_writes_only_what_changed() -> None:
    cache = world(NODES, quotas=[quota("team-a", hard={"wholeGpus": 2}), quota("team-b", hard={"wholeGpus": 2})])
    api, leader = FakeCustomApi(), [False]
    writer = QuotaStatusWriter(cache, api, lambda: leader[0])
    assert writer.run_once() == 0 and not api.patches  # not the leader: nothing written
    leader[0] = True
    assert writer.run_once() == 2
    assert writer.run_once() == 0  # unchanged (written, not yet seen by the watch)
    seen(cache, api)
    writer.written.clear()  # as a new leader: compares with what the watch delivered
    assert writer.run_once() == 0
    hold(cache, "p", "team-a", whole=1)
    assert writer.run_once() == 1
    namespace, name, body = api.patches[-1]
    assert (namespace, name) == ("team-a", "gpus")
    assert body == [{"op": "add", "path": "/status", "value": {
        "hard": {"wholeGpus": 2}, "used": {"memoryMiB": CARD, "computePercent": 100, "wholeGpus": 1},
        "models": {"V100": {"used": {"memoryMiB": CARD, "computePercent": 100, "wholeGpus": 1}}}}}]


def test_a_pass_writes_at_most_max_writes_longest_waiting_first() -> None:
    cache = world(NODES, quotas=[quota(f"ns-{i}", hard={"wholeGpus": 1}) for i in range(5)])
    api, clock = FakeCustomApi(), [0.0]
    writer = QuotaStatusWriter(cache, api, lambda: True, max_writes=2, clock=lambda: clock[0])
    for _ in range(3):
        clock[0] += 1
        writer.run_once()
    assert sorted(ns for ns, _, _ in api.patches) == [f"ns-{i}" for i in range(5)]
    assert len(api.patches) == 5  # the last pass wrote the fifth only: the others had not changed


def test_a_failed_write_is_retried_on_the_next_pass() -> None:
    cache = world(NODES, quotas=[quota("team-a", hard={"wholeGpus": 1})])
    api, fail = FakeCustomApi(), [True]
    original = api.patch_namespaced_custom_object_status

    def flaky(*args: Any, **kwargs: Any) -> None:
        if fail[0]:
            raise ApiException(status=500, reason="boom")
        original(*args, **kwargs)

    api.patch_namespaced_custom_object_status = flaky  # type: ignore[method-assign]
    writer = QuotaStatusWriter(cache, api, lambda: True)
    assert writer.run_once() == 0
    fail[0] = False
    assert writer.run_once() == 1
