"""DRA claims in the extender's ledger (issue 24, "One ledger"): a ResourceClaim allocated from
gpupool's driver books its shares on the card its device names, the filter sees them as used, the
namespace's usage (what GpuQuotas are checked against) and the ledger's totals count them, and a
claim that cannot be read stops placements on its node with the reason instead of crashing the
watch or losing what the claim holds."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard, NodeSpec
from gpupool.core.usage import total
from gpupool.extender.booking_keeper import ASSUMED_REFUSED
from gpupool.extender.cache import ClusterCache
from gpupool.extender.dra_watch import apply_claim_event, replace_claims
from gpupool.extender.metrics import LedgerTotals
from gpupool.extender.service import ExtenderService, ExtenderSettings
from gpupool.extender.wakeup import loosening_signature
from gpupool.kube.claim_holding import ClaimRecord, claim_key, claim_placement, is_claim_key, read_claim
from gpupool.kube.dra_claims import AllocatedShare, ClaimError
from gpupool.kube.tenancy import pod_tenancy
from gpupool.kube.translate import pod_request
from tests.extender.tenancy_world import gpu_pod, quota, world
from tests.kube.builders import container, node, placed_pod, pod

DRIVER = "gpu.gpupool.io"
GIB = 1024  # MiB
CARD = 16 * GIB


def claim(name: str = "c1", node_name: str = "n1", device: str = "gpu-0", memory: str | None = "12Gi",
          compute: str | None = None, namespace: str = "team", uid: str = "", driver: str = DRIVER,
          allocated: bool = True) -> dict[str, Any]:
    consumed = {k: v for k, v in (("memory", memory), ("compute", compute)) if v is not None}
    result: dict[str, Any] = {"request": "gpu", "driver": driver, "pool": node_name, "device": device}
    if consumed:
        result["consumedCapacity"] = consumed
    status = {"allocation": {"devices": {"results": [result]}}} if allocated else {}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": uid or f"uid-{name}"}, "status": status}


def ledger(*nodes: dict[str, Any]) -> ClusterCache:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes(list(nodes) or [node("n1", [CARD]), node("n2", [CARD])])
    cache.replace_pods([])
    return cache


def free_mib(cache: ClusterCache, name: str = "n1") -> list[int]:
    return [u.memory_free for u in cache.state.card_usage(name)]


def passed(cache: ClusterCache, mib: int, names: list[str]) -> tuple[list[str], dict[str, str]]:
    service = ExtenderService(cache, None, settings=ExtenderSettings(filter_best_only=False))
    out = service.filter(pod_request(pod("next", container(mib=mib)), ResourceNames()), names)
    cache.unassume("default/next", ASSUMED_REFUSED)  # the filter's assumption: not what these tests count
    return out.passed, out.failed


# ------------------------------------------------------------------------------------ decoding
def test_a_claim_key_is_never_a_pods_and_counts_for_its_namespace() -> None:
    key = claim_key("team", "c1")
    assert key == "team/claim:c1" and is_claim_key(key) and not is_claim_key("team/c1")


def test_an_allocated_claim_reads_as_its_node_and_shares() -> None:
    record = read_claim(claim(memory="4Gi", compute="30", device="gpu-1"), DRIVER)
    assert record == ClaimRecord("team/claim:c1", "uid-c1", "n1",
                                 (AllocatedShare("gpu", "n1", "gpu-1", 1, 4096, 30),))


@pytest.mark.parametrize("obj", [
    pytest.param(claim(allocated=False), id="not-allocated"),
    pytest.param(claim(driver="nic.example"), id="another-driver"),
    pytest.param({"metadata": {"namespace": "team"}, "status": {}}, id="no-name"),
])
def test_a_claim_holding_none_of_the_drivers_devices_books_nothing(obj: dict[str, Any]) -> None:
    assert read_claim(obj, DRIVER) is None


def broken(path: str, value: Any) -> dict[str, Any]:
    obj = claim()
    target: Any = obj
    *parents, last = path.split(".")
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[last] = value
    return obj


@pytest.mark.parametrize(("obj", "node_name", "reason"), [
    pytest.param(broken("status.allocation.devices.results.0.device", "gpu-x"), "n1", "is not one of gpupool's",
                 id="foreign-device-name"),
    pytest.param(broken("status.allocation.devices.results.0.consumedCapacity", {"memory": "lots"}), "n1",
                 "not a Kubernetes quantity", id="bad-quantity"),
    pytest.param(broken("status.allocation.devices.results.0.consumedCapacity", {"compute": "250"}), "n1",
                 "not 0-100 percent", id="compute-over-100"),
    pytest.param(broken("status.allocation.devices.results.0.consumedCapacity", "4Gi"), "n1",
                 "consumedCapacity is not a map", id="consumed-not-a-map"),
    pytest.param(broken("status.allocation.devices", ["x"]), "", "devices is not a map", id="devices-not-a-map"),
    pytest.param(broken("status.allocation.devices.results", "x"), "", "results is not a list",
                 id="results-not-a-list"),
    pytest.param(broken("status.allocation.devices.results.0.pool", ""), "", "pools", id="no-pool"),
])
def test_a_malformed_allocation_is_a_problem_with_its_reason_never_an_exception(
        obj: dict[str, Any], node_name: str, reason: str) -> None:
    record = read_claim(obj, DRIVER)
    assert record is not None and record.problem is not None and reason in record.problem
    assert record.node == node_name and record.key == "team/claim:c1"


def test_shares_land_on_the_ledger_position_of_the_card_the_device_names() -> None:
    cards = (GpuCard(2, "GPU-a", "A100", CARD), GpuCard(5, "GPU-b", "A100", CARD))
    spec = NodeSpec("n1", 32_000, 64 * GIB, cards=cards)
    record = read_claim(claim(device="gpu-5", memory="4Gi", compute="25"), DRIVER)
    assert record is not None
    placement = claim_placement(record, spec)
    assert dict(placement.held_per_card()) == {1: (4096, 250, False)}
    whole = read_claim(claim(device="gpu-2", memory=None), DRIVER)
    assert whole is not None and dict(claim_placement(whole, spec).held_per_card()) == {0: (CARD, 1000, True)}
    missing = read_claim(claim(device="gpu-3"), DRIVER)
    assert missing is not None
    with pytest.raises(ClaimError, match=r"gpu-3 is not among node n1's cards \(it publishes \[2, 5\]\)"):
        claim_placement(missing, spec)


# ------------------------------------------------------------------------------------- booking
def test_a_claims_memory_is_used_for_the_filter_until_the_claim_is_deleted() -> None:
    cache = ledger()
    replace_claims(cache, [claim(memory="12Gi")])
    assert free_mib(cache) == [CARD - 12 * GIB]
    ok, failed = passed(cache, 8 * GIB, ["n1", "n2"])
    assert ok == ["n2"] and "n1" in failed  # an extended-resource pod is not placed on the claim's memory
    assert passed(cache, 4 * GIB, ["n1"])[0] == ["n1"]
    apply_claim_event(cache, "DELETED", claim())
    assert free_mib(cache) == [CARD]
    assert passed(cache, 8 * GIB, ["n1"])[0] == ["n1"]


def test_a_claim_deallocated_gives_its_card_back_and_a_stale_delete_is_ignored() -> None:
    cache = ledger()
    apply_claim_event(cache, "ADDED", claim(uid="new"))
    apply_claim_event(cache, "DELETED", claim(uid="old"))  # an older claim of the same name
    assert free_mib(cache) == [CARD - 12 * GIB]
    apply_claim_event(cache, "MODIFIED", claim(uid="new", allocated=False))
    assert free_mib(cache) == [CARD] and not cache.claims.records


def test_a_relist_releases_the_claims_it_no_longer_has_and_books_the_new_ones() -> None:
    cache = ledger()
    replace_claims(cache, [claim("a", memory="4Gi"), claim("b", memory="4Gi", node_name="n2")])
    replace_claims(cache, [claim("b", memory="4Gi", node_name="n2"), claim("c", memory="2Gi")])
    assert free_mib(cache, "n1") == [CARD - 2 * GIB] and free_mib(cache, "n2") == [CARD - 4 * GIB]
    assert cache.claims.booked() == 2


def test_quotas_and_totals_count_claims_under_their_namespace() -> None:
    cache = ledger()
    replace_claims(cache, [claim(memory="4Gi", compute="30")])
    used = total(cache.state.usage.of("team"))
    assert (used.memory_mib, used.compute) == (4 * GIB, 300)
    totals = LedgerTotals.read(cache)
    assert totals.memory_allocated_mib == 4 * GIB and totals.compute_allocated_permille == 300


def test_a_claim_waits_for_its_node_and_follows_it_when_it_leaves_and_comes_back() -> None:
    cache = ledger(node("n1", [CARD]))
    replace_claims(cache, [claim(node_name="n2")])
    assert cache.claims.booked() == 0  # n2 is not known yet: booked when it arrives
    cache.upsert_node(node("n2", [CARD]))
    assert free_mib(cache, "n2") == [CARD - 12 * GIB]
    cache.remove_node("n2")
    cache.upsert_node(node("n2", [CARD]))
    assert free_mib(cache, "n2") == [CARD - 12 * GIB]


def test_an_unreadable_claim_stops_placements_on_its_node_until_it_is_fixed() -> None:
    cache = ledger()
    apply_claim_event(cache, "ADDED", broken("status.allocation.devices.results.0.consumedCapacity",
                                             {"memory": "lots"}))
    ok, failed = passed(cache, 1 * GIB, ["n1", "n2"])
    assert ok == ["n2"] and "team/claim:c1" in failed["n1"] and "not a Kubernetes quantity" in failed["n1"]
    apply_claim_event(cache, "MODIFIED", claim(memory="4Gi"))
    assert passed(cache, 1 * GIB, ["n1"])[0] == ["n1"] and free_mib(cache) == [CARD - 4 * GIB]


def test_a_claim_on_a_card_the_node_does_not_publish_stops_placements_there() -> None:
    cache = ledger()
    apply_claim_event(cache, "ADDED", claim(device="gpu-7"))
    ok, failed = passed(cache, 1 * GIB, ["n1"])
    assert ok == [] and "gpu-7 is not among node n1's cards" in failed["n1"]


def test_a_claim_booked_beside_a_pod_beyond_the_card_is_reported_and_heals_when_one_leaves() -> None:
    """The allocator does not see extended-resource pods: a claim on their memory is the cluster's
    state, booked over the card's capacity (the node agent refuses to prepare it), never hidden."""
    cache = ledger()
    cache.replace_pods([placed_pod("er", "n1", 0, 8 * GIB)])
    apply_claim_event(cache, "ADDED", claim(memory="12Gi"))
    assert cache.overcommitted_cards() == 1
    assert set(cache.conflicts) == {"default/er", "team/claim:c1"}
    assert passed(cache, 1 * GIB, ["n1"])[0] == []
    apply_claim_event(cache, "DELETED", claim())
    assert cache.overcommitted_cards() == 0 and free_mib(cache) == [CARD - 8 * GIB]


def test_a_reading_bug_keeps_the_claims_node_refused_and_the_watch_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ledger()
    apply_claim_event(cache, "ADDED", claim(memory="4Gi"))

    def explode(obj: Any, driver: str) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("gpupool.extender.dra_bookings.read_claim", explode)
    apply_claim_event(cache, "MODIFIED", copy.deepcopy(claim(memory="4Gi", compute="10")))
    ok, failed = passed(cache, 1 * GIB, ["n1", "n2"])
    assert ok == ["n2"] and "boom" in failed["n1"]


def test_readiness_waits_for_the_claims_when_they_are_watched() -> None:
    cache = ledger()
    assert cache.synced
    cache.claims.required = True
    assert not cache.synced
    replace_claims(cache, [])
    assert cache.synced


def test_a_claim_released_wakes_the_pods_the_extender_refused() -> None:
    """kube-scheduler retries an extender's refusal on no event of a claim: the wake-up must see it."""
    cache = ledger()
    replace_claims(cache, [claim(memory="12Gi")])
    before = loosening_signature(cache, lambda _: {})
    apply_claim_event(cache, "MODIFIED", claim(memory="12Gi", compute="5"))  # a change that frees nothing
    assert loosening_signature(cache, lambda _: {}) != before  # re-booked: released once, booked again
    moved = loosening_signature(cache, lambda _: {})
    apply_claim_event(cache, "DELETED", claim())
    assert loosening_signature(cache, lambda _: {}) != moved


def test_a_namespaces_gpu_quota_counts_its_claims() -> None:
    """A GpuQuota of 16 GiB in team-a: a 12 GiB claim there leaves 4 GiB for its pods, whatever
    the cards have free; another namespace is not charged."""
    cache = world([node("n1", [CARD]), node("n2", [CARD])], quotas=[quota("team-a", hard={"memoryMiB": 16 * GIB})])
    replace_claims(cache, [claim(memory="12Gi", namespace="team-a")])
    refused = quota_filter(cache, gpu_pod("p", "team-a", gpu_mem=32))  # 8 GiB
    assert refused.passed == []
    assert set(refused.failed.values()) == {"GpuQuota team-a/gpus: GPU memory limit 16384 MiB, used 12288 MiB, "
                                            "asked 8192 MiB"}
    assert quota_filter(cache, gpu_pod("p", "team-a", gpu_mem=16)).passed == ["n1", "n2"]  # 4 GiB
    assert quota_filter(cache, gpu_pod("p", "team-b", gpu_mem=32)).passed == ["n2"]


def quota_filter(cache: ClusterCache, raw: dict[str, Any]) -> Any:
    request = pod_request(raw, ResourceNames())
    service = ExtenderService(cache, None, settings=ExtenderSettings(filter_best_only=False))
    outcome = service.filter(request, ["n1", "n2"], frozenset(), pod_tenancy(raw, cache.tenancy.names))
    cache.unassume(request.key, ASSUMED_REFUSED)
    return outcome


def test_a_claim_ends_the_filters_assumption_on_the_card_it_takes() -> None:
    """The filter passed one node and assumed the pod's 8 GiB there; the allocator then put a
    12 GiB claim on that card. The claim is the cluster's, the assumption only the filter's guess:
    it ends (the pod's bind decides again) and the card is not reported over-committed."""
    cache = ledger(node("n1", [CARD]))
    service = ExtenderService(cache, None, settings=ExtenderSettings())
    request = pod_request(pod("next", container(mib=8 * GIB)), ResourceNames())
    assert service.filter(request, ["n1"]).passed == ["n1"] and cache.assumed_pods == 1
    apply_claim_event(cache, "ADDED", claim(memory="12Gi"))
    assert cache.assumed_pods == 0 and cache.assumption_ends["conflict"] == 1
    assert cache.overcommitted_cards() == 0 and free_mib(cache) == [CARD - 12 * GIB]
