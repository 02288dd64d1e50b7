"""The bind of a DRA claim pod (issue 24, docs/dra.md "Choosing between the extender path and the
DRA path"): gpupool's scheduler asks the extender about claim pods too, and the extender binds
every pod it is asked about; a pod whose GPUs come from claims only gets a plain Binding and no
assignment (its claims' allocation books its cards), a pod asking for nothing still gets the
refusal."""

from __future__ import annotations

from typing import Any

from gpupool.api.names import ResourceNames
from tests.extender.binder_world import ASSIGNMENT, free_mib, world
from tests.kube.builders import container, node, pod


def claim_pod(name: str) -> dict[str, Any]:
    obj = pod(name, {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}})
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
    return obj


def test_a_claim_pod_is_bound_without_an_assignment_and_books_nothing() -> None:
    api, cache, binder = world([node("n1", [16276])])
    api.create_pod(claim_pod("p"))
    result = binder.bind("default", "p", "uid-default-p", "n1")
    assert result.ok, result.error
    stored = api.get_pod("default", "p")
    assert stored["spec"]["nodeName"] == "n1"
    annotations = stored["metadata"].get("annotations") or {}
    assert ASSIGNMENT not in annotations and ResourceNames().remote_share not in annotations
    assert free_mib(cache, "n1") == [16276]
    assert cache.in_flight() == 0


def test_a_claim_pod_bound_already_is_idempotent_there_and_refused_elsewhere() -> None:
    api, _cache, binder = world([node("n1", [16276]), node("n2", [16276])])
    api.create_pod(claim_pod("p"))
    assert binder.bind("default", "p", "uid-default-p", "n1").ok
    assert binder.bind("default", "p", "uid-default-p", "n1").ok
    assert "already bound to node n1" in binder.bind("default", "p", "uid-default-p", "n2").error


def test_a_pod_with_neither_gpu_resources_nor_claims_is_still_refused() -> None:
    api, _cache, binder = world([node("n1", [16276])])
    api.create_pod(pod("cpu", container(cpu="1")))
    assert "asks for no resource gpupool manages" in binder.bind("default", "cpu", "uid-default-cpu", "n1").error
    assert api.get_pod("default", "cpu")["spec"].get("nodeName") in (None, "")
