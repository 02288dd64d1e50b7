"""Pods held back by a GpuQuota bind within 10 s of the quota being raised or deleted.

kube-scheduler does not watch gpupool's objects: the pods the extender refused wait for some
cluster event or kube-scheduler's five-minute flush (the issue 28 probe: 88 s after a delete, still
pending 101 s after a raise). The extender now nudges the refused pods a change lets fit
(gpupool/extender/wakeup.py); nothing else touches the pods or nodes here.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from gpupool.api.names import ResourceNames
from tests.e2e.e2e_support import ExtenderProcess, MakeNode, wait_for
from tests.e2e.test_tenancy_e2e import (
    GROUP,
    VERSION,
    cards_of,
    crds,
    custom,
    gpu_node,
    gpu_quota,
    pod,
    refused_with,
    resource_group,
)

pytestmark = pytest.mark.e2e

__all__ = ["crds", "custom"]  # the CRDs and the custom objects API, as fixtures of this module too

NAMES = ResourceNames()
WAKE_S = 10.0
HELD_BACK = 5


def bound_within(core_v1: client.CoreV1Api, namespace: str, names: list[str], since: float, limit: float) -> float:
    """Seconds from ``since`` until every pod in ``names`` is bound (fails past ``limit``)."""
    def all_bound() -> float | None:
        pods = {p.metadata.name: p for p in core_v1.list_namespaced_pod(namespace).items}
        return time.monotonic() - since if all(pods[n].spec.node_name for n in names) else None
    return wait_for(all_bound, timeout=limit + 5, what=f"{names} bound", interval=0.2)


def held_back(core_v1: client.CoreV1Api, namespace: str, custom: client.CustomObjectsApi,
              make_node: MakeNode) -> list[str]:
    """A quota of no whole GPU, and pods asking one each, refused by the extender for it."""
    gpu_node(make_node, HELD_BACK)
    gpu_quota(custom, namespace, {"hard": {"wholeGpus": 0}})
    time.sleep(1)  # the extender's watch delivers the quota
    names = [f"w{i}" for i in range(HELD_BACK)]
    for name in names:
        core_v1.create_namespaced_pod(namespace, pod(name, whole=1))
    for name in names:
        refused_with(core_v1, namespace, name, f"GpuQuota {namespace}/gpus")
    time.sleep(2)  # parked in kube-scheduler's unschedulable queue
    assert all(not p.spec.node_name for p in core_v1.list_namespaced_pod(namespace).items)
    return names


def test_a_quota_raised_binds_the_pods_it_held_back_within_10_s(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, custom: client.CustomObjectsApi,
    gpupool_extender: ExtenderProcess,
) -> None:
    names = held_back(core_v1, namespace, custom, make_node)
    raised = time.monotonic()
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "gpuquotas", "gpus",
                                          {"spec": {"hard": {"wholeGpus": HELD_BACK}}})
    took = bound_within(core_v1, namespace, names, raised, WAKE_S)
    print(f"\nquota raised: {HELD_BACK} pods bound {took:.1f} s later")
    assert took <= WAKE_S


def test_a_quota_deleted_binds_the_pods_it_held_back_within_10_s(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, custom: client.CustomObjectsApi,
    gpupool_extender: ExtenderProcess,
) -> None:
    names = held_back(core_v1, namespace, custom, make_node)
    deleted = time.monotonic()
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "gpuquotas", "gpus")
    took = bound_within(core_v1, namespace, names, deleted, WAKE_S)
    print(f"\nquota deleted: {HELD_BACK} pods bound {took:.1f} s later")
    assert took <= WAKE_S


def test_a_group_widened_binds_its_waiting_pod_within_10_s(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, custom: client.CustomObjectsApi,
    gpupool_extender: ExtenderProcess,
) -> None:
    first, second = gpu_node(make_node, 1), gpu_node(make_node, 1)
    resource_group(custom, "widen", {first: None})
    core_v1.create_namespaced_pod(namespace, pod("holder", whole=1, group="widen"))
    assert cards_of(core_v1, namespace, "holder") == {f"GPU-{first}-0"}
    core_v1.create_namespaced_pod(namespace, pod("waiter", whole=1, group="widen"))
    refused_with(core_v1, namespace, "waiter", "not in resource group widen")
    time.sleep(2)
    widened = time.monotonic()
    custom.patch_cluster_custom_object(GROUP, VERSION, "resourcegroups", "widen",
                                       {"spec": {"nodes": [{"name": first}, {"name": second}]}})
    took = bound_within(core_v1, namespace, ["waiter"], widened, WAKE_S)
    print(f"\ngroup widened: the waiting pod bound {took:.1f} s later")
    assert took <= WAKE_S and cards_of(core_v1, namespace, "waiter") == {f"GPU-{second}-0"}
