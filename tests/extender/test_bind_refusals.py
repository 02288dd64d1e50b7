"""``/bind`` binds only GPU pods kube-scheduler scheduled, by their UID, to nodes in the ledger.

Each refusal is a 200 whose ``ExtenderBindingResult.Error`` says why (kube-scheduler shows it in
the pod's events), and nothing reaches the API: no assignment written, no Binding posted.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gpupool.extender.cache import ClusterCache
from gpupool.testing.fake_api import FakePodApi
from tests.extender.http_world import post, run
from tests.kube.builders import container, pod

ASSIGNMENT = "gpupool.io/assignment-v1"


def gpu_pod() -> dict[str, Any]:
    return pod("p", container(mib=1000))


def plain_pod() -> dict[str, Any]:
    return pod("p", container(cpu="1"))


@pytest.mark.parametrize(
    ("make", "body", "reason"),
    [
        pytest.param(plain_pod, {"PodUID": "uid-default-p", "Node": "N3"},
                     "pod default/p asks for no resource gpupool manages", id="no-managed-resource"),
        pytest.param(gpu_pod, {"PodUID": "", "Node": "N3"}, "names no pod UID", id="empty-pod-uid"),
        pytest.param(gpu_pod, {"Node": "N3"}, "names no pod UID", id="pod-uid-absent"),
        pytest.param(gpu_pod, {"PodUID": "uid-default-other", "Node": "N3"},
                     "pod default/p was replaced (uid uid-default-p, asked uid-default-other)",
                     id="pod-uid-of-another-pod"),
        pytest.param(gpu_pod, {"PodUID": "uid-default-p", "Node": "N9"},
                     "node N9 is not known to the gpupool extender", id="node-not-in-ledger"),
    ],
)
def test_bind_refuses_and_writes_nothing(make: Any, body: dict[str, str], reason: str) -> None:
    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        api.create_pod(make())
        status, answer = await post(client, "/bind", {"PodName": "p", "PodNamespace": "default", **body})
        assert status == 200 and reason in answer["Error"], answer
        assert [call for call in api.calls if not call.startswith("get ")] == []
        stored = api.get_pod("default", "p")
        assert not stored["spec"].get("nodeName")
        assert ASSIGNMENT not in stored["metadata"]["annotations"]
        assert cache.in_flight() == 0 and "default/p" not in cache.state.placements

    run(scenario, pods=[])


def test_the_same_gpu_pod_with_its_uid_on_a_known_node_is_bound() -> None:
    """The refusals above are about the request, not the pod: the same pod asked properly binds."""

    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        api.create_pod(gpu_pod())
        body = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-default-p", "Node": "N3"}
        assert await post(client, "/bind", body) == (200, {"Error": ""})
        assert api.get_pod("default", "p")["spec"]["nodeName"] == "N3"

    run(scenario, pods=[])
