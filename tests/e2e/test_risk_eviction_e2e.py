"""``--risk-action evict`` against the real kube-apiserver: the Eviction API in the version the server
speaks (policy/v1 on every supported release; the fallback to policy/v1beta1 for 1.20 and 1.21 is
a unit test's), and a missing pod is an error."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.nodeagent.risk.eviction import evict_with
from tests.e2e.e2e_support import NO_SCHEDULER, wait_for

pytestmark = pytest.mark.e2e


def test_the_risk_evictor_evicts_a_pod_and_a_missing_one_is_an_error(core_v1: client.CoreV1Api, namespace: str) -> None:
    core_v1.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rogue"},
        "spec": {"schedulerName": NO_SCHEDULER, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "app", "image": "busybox"}]}})
    evict = evict_with(core_v1)
    asyncio.run(evict(namespace, "rogue"))
    wait_for(lambda: not [p for p in core_v1.list_namespaced_pod(namespace).items if p.metadata.name == "rogue"],
             timeout=30, what="the evicted pod to be gone")
    with pytest.raises(ApiException) as missing:
        asyncio.run(evict(namespace, "rogue"))
    assert missing.value.status == 404
