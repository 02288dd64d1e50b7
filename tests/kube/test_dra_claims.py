"""One reading of a ResourceClaim allocated from gpupool's DRA driver (the node agent's and, next,
the extender's): shares per result, the whole card when no capacity was consumed, other drivers'
results ignored, and a reason for each result that cannot be read."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.kube.dra_claims import AllocatedShare, ClaimError, claim_shares

DRIVER = "gpu.gpupool.io"


def claim(results: list[dict[str, Any]], reserved: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "c", "uid": "u1"},
            "status": {"allocation": {"devices": {"results": results}},
                       **({"reservedFor": reserved} if reserved is not None else {})}}


def res(device: str = "gpu-0", consumed: dict[str, Any] | None = None, driver: str = DRIVER,
        request: str = "gpu") -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": "node-a", "device": device}
    if consumed is not None:
        out["consumedCapacity"] = consumed
    return out


def test_each_result_of_the_driver_is_a_share_and_others_are_ignored() -> None:
    read = claim_shares(claim([res("gpu-0", {"memory": "4Gi", "compute": "30"}), res("nic-1", driver="nic.example"),
                               res("gpu-3", {"memory": "1536Mi"}, request="second")],
                              [{"resource": "pods", "name": "p", "uid": "pu"}]), DRIVER)
    assert (read.uid, read.pod, read.pod_uid) == ("u1", "p", "pu")
    assert read.shares == (AllocatedShare("gpu", "node-a", "gpu-0", 0, 4096, 30),
                           AllocatedShare("second", "node-a", "gpu-3", 3, 1536, 0))


def test_no_consumed_capacity_is_the_whole_card_and_no_reservation_no_pod() -> None:
    read = claim_shares(claim([res("gpu-2")]), DRIVER)
    assert read.shares[0].memory_mib is None and read.shares[0].compute_percent == 0
    assert (read.pod, read.pod_uid) == ("", "")


def test_a_claim_without_the_drivers_devices_has_no_shares() -> None:
    assert claim_shares(claim([res(driver="nic.example")]), DRIVER).shares == ()


@pytest.mark.parametrize(("obj", "reason"), [
    pytest.param({"metadata": {"namespace": "ns", "name": "c"}}, "claim ns/c is not allocated", id="unallocated"),
    pytest.param({"status": {"allocation": {"devices": {"results": "x"}}}}, "is not a list", id="results-not-list"),
    pytest.param(claim([res("gpu-x")]), "device 'gpu-x' is not one of gpupool's", id="bad-device"),
    pytest.param(claim([res(consumed={"memory": "a lot"})]), "is not a Kubernetes quantity", id="bad-quantity"),
    pytest.param(claim([res(consumed={"memory": "0"})]), "is not positive", id="no-memory"),
    pytest.param(claim([res(consumed={"compute": "101"})]), "is not 0-100 percent", id="over-100"),
    pytest.param(claim([res(consumed=["memory"])]), "consumedCapacity is not a map", id="not-a-map"),  # type: ignore[arg-type]
])
def test_unreadable_allocations_say_why(obj: dict[str, Any], reason: str) -> None:
    with pytest.raises(ClaimError, match=reason):
        claim_shares(obj, DRIVER)
