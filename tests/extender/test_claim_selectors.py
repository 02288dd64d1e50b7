"""A claim's CEL selectors narrow the extender's card choice for its pod (issue 24, docs/dra.md
"Selectors the extender reads"): a node whose only card with room is one the selectors exclude is
not preferred, and selectors the extender cannot read or evaluate leave the pod to kube-scheduler's
own choice, as before, with the reason logged once."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard
from gpupool.extender.booking_keeper import ASSUMED_REFUSED
from gpupool.extender.cache import ClusterCache
from gpupool.extender.claim_pods import ClaimPodRequests
from gpupool.extender.dra_watch import apply_claim_event, replace_claims
from gpupool.extender.service import ExtenderService
from gpupool.kube.translate import pod_request
from tests.extender.test_claim_pods import CARD, claim, claim_pod, request
from tests.kube.builders import node

A = 'device.attributes["gpu.gpupool.io"]'
A100 = "NVIDIA-A100-SXM4-16GB"
V100 = "Tesla-V100-SXM2-16GB"
WANTS_A100 = [{"cel": {"expression": f'{A}.model.startsWith("NVIDIA-A100")'}}]


def mixed_node(name: str, *models: str) -> dict[str, Any]:
    obj = node(name, [CARD])
    cards = tuple(GpuCard(index=i, uuid=f"GPU-{name}-{i}", model=m, memory_mib=CARD) for i, m in enumerate(models))
    obj["metadata"]["annotations"]["gpupool.io/inventory-v1"] = encode_inventory(Inventory(cards, None))
    return obj


def world(*claims: dict[str, Any]) -> tuple[ClusterCache, ExtenderService, ClaimPodRequests]:
    """n1: an A100 with 2 GiB free and a V100 with 8 GiB free; n2: an empty A100."""
    cache = ClusterCache()
    cache.replace_nodes([mixed_node("n1", A100, V100), mixed_node("n2", A100)])
    cache.replace_pods([])
    replace_claims(cache, [claim("held-a", allocated_on=("n1", "gpu-0", "14Gi")),
                           claim("held-v", allocated_on=("n1", "gpu-1", "8Gi")), *claims])
    return cache, ExtenderService(cache, None), ClaimPodRequests(cache.claims, cache.lock)


def passed(cache: ClusterCache, service: ExtenderService, claims: ClaimPodRequests, name: str) -> list[str]:
    obj = claim_pod("p", name)
    asked = claims.request(obj, pod_request(obj, ResourceNames()))
    out = service.filter(asked, ["n2", "n1"], pod=obj)
    assert not out.error
    cache.unassume(asked.key, ASSUMED_REFUSED)
    return out.passed


def test_a_node_whose_only_card_with_room_is_excluded_is_not_preferred() -> None:
    cache, service, claims = world(claim("any", request()), claim("a100", request(selectors=WANTS_A100)))
    assert passed(cache, service, claims, "any") == ["n1"]  # the half-used V100 packs best
    assert passed(cache, service, claims, "a100") == ["n2"]  # n1's A100 has 2 GiB: only n2 holds it


def test_a_claim_that_fits_an_allowed_card_still_packs() -> None:
    small = request(memory="1Gi", selectors=WANTS_A100)
    cache, service, claims = world(claim("small", small))
    assert passed(cache, service, claims, "small") == ["n1"]  # n1's A100 has room for 1 GiB


def test_the_request_carries_the_allowed_cards_as_its_scope() -> None:
    _cache, _service, claims = world(claim("a100", request(selectors=WANTS_A100)))
    obj = claim_pod("p", "a100")
    gpu = claims.request(obj, pod_request(obj, ResourceNames())).gpu_containers[0].gpu
    assert gpu is not None and gpu.scope is not None
    assert gpu.scope.within[0].uuids == {"GPU-n1-0", "GPU-n2-0"}


@pytest.mark.parametrize(("expression", "allowed"), [
    (f"{A}.index == 0", {"GPU-n1-0", "GPU-n2-0"}),
    (f'{A}.uuid != "GPU-n1-0" && {A}.model.startsWith("NVIDIA")', {"GPU-n2-0"}),
    (f'{A}.model == "{V100}"', {"GPU-n1-1"}),
])
def test_cards_alike_but_for_their_identity_are_told_apart_when_the_selector_reads_it(
        expression: str, allowed: set[str]) -> None:
    _cache, _service, claims = world(claim("c", request(selectors=[{"cel": {"expression": expression}}])))
    obj = claim_pod("p", "c")
    gpu = claims.request(obj, pod_request(obj, ResourceNames())).gpu_containers[0].gpu
    assert gpu is not None and gpu.scope is not None and gpu.scope.within[0].uuids == allowed


def test_a_node_added_later_is_evaluated_too() -> None:
    cache, service, claims = world(claim("a100", request(selectors=WANTS_A100)))
    assert passed(cache, service, claims, "a100") == ["n2"]
    apply_claim_event(cache, "ADDED", claim("fill", allocated_on=("n2", "gpu-0", "14Gi")))
    cache.replace_nodes([mixed_node("n1", A100, V100), mixed_node("n2", A100), mixed_node("n3", V100, A100)])
    obj = claim_pod("p", "a100")
    asked = claims.request(obj, pod_request(obj, ResourceNames()))
    assert service.filter(asked, ["n1", "n2", "n3"], pod=obj).passed == ["n3"]


@pytest.mark.parametrize("selectors", [
    pytest.param([{"cel": {"expression": f'{A}.model.matches("A100")'}}], id="outside-the-subset"),
    pytest.param([{"cel": {"expression": f'{A}.profile == "1g.10gb"'}}], id="fails-on-a-card"),
    pytest.param([{"cel": {"expression": f'{A}.model == "NVIDIA-H100"'}}], id="allows-no-known-card"),
])
def test_selectors_not_understood_leave_the_pod_as_before_logged_once(
        selectors: list[dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    _cache, _service, claims = world(claim("odd", request(selectors=selectors)))
    obj = claim_pod("p", "odd")
    base = pod_request(obj, ResourceNames())
    with caplog.at_level(logging.INFO, logger="gpupool.extender.claim_pods"):
        assert claims.request(obj, base) is base
        assert claims.request(obj, base) is base
    told = [r.getMessage() for r in caplog.records if "no node choice by gpupool" in r.getMessage()]
    assert len(told) == 1 and "selector" in told[0]


def test_a_uuid_selectors_verdicts_are_kept_when_the_node_layout_changes() -> None:
    """A selector reading UUIDs evaluates every card on its own (250-400 ms on 5,000 nodes of 8
    cards): a node added must cost its own cards' evaluations, not the whole cluster's again, and
    the answer is the one a fresh evaluation gives."""
    from gpupool.api.dra import driver_name
    from gpupool.core.model import NodeSpec
    from gpupool.core.state import ClusterState
    from gpupool.extender.claim_selectors import SelectedCards
    from gpupool.kube.device_selector import device_schema, selection

    def spec(name: str) -> NodeSpec:
        return NodeSpec(name, 8_000, 32_768, tuple(GpuCard(index=i, uuid=f"GPU-{name}-{i}", model=A100,
                                                           memory_mib=CARD) for i in range(4)))

    driver = driver_name()
    state = ClusterState([spec(f"n{i}") for i in range(5)])
    chosen = selection([{"cel": {"expression": f'{A}.uuid != "GPU-n1-2"'}}], device_schema(driver))
    assert chosen is not None
    evaluated: list[str] = []

    class Counting(type(chosen)):  # type: ignore[misc]
        def matches(self, device: Any) -> bool:
            evaluated.append(device.attributes[driver]["uuid"])
            return super().matches(device)

    counting = Counting(chosen.texts, chosen.trees)
    selected = SelectedCards(state, driver)
    first = selected.scope(counting)
    assert len(evaluated) == 20 and not isinstance(first, str)
    state.upsert_node(spec("n5"))
    evaluated.clear()
    again = selected.scope(counting)
    assert sorted(evaluated) == [f"GPU-n5-{i}" for i in range(4)]  # only the new node's cards
    fresh = SelectedCards(state, driver).scope(chosen)
    assert again == fresh and not isinstance(again, str)
    assert "GPU-n1-2" not in again.within[0].uuids and "GPU-n5-0" in again.within[0].uuids


# ------------------------------------------------------------------ the DeviceClass's own selectors
def device_class(name: str, *expressions: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]}}


PINS = 'device.driver == "gpu.gpupool.io"'
A100_SHARE = device_class("a100-share", PINS, f'{A}.model.startsWith("NVIDIA-A100")')


def classes_world(*classes: dict[str, Any]) -> tuple[ClusterCache, ExtenderService, ClaimPodRequests, Any]:
    from gpupool.extender.gpupool_classes import GpupoolClasses

    cache, service, claims = world(claim("any", request()), claim("a100", request(selectors=WANTS_A100)),
                                   claim("by-class", request(device_class="a100-share")))
    watched = GpupoolClasses(cache.claims, cache.lock)
    watched.replace([device_class("gpu.gpupool.io", PINS), *classes])
    return cache, service, claims, watched


def test_a_class_selecting_a100_steers_its_claims_pod_like_a_claim_selecting_a100() -> None:
    cache, service, claims, _ = classes_world(A100_SHARE)
    assert passed(cache, service, claims, "a100") == ["n2"]
    assert passed(cache, service, claims, "by-class") == ["n2"]  # n1's A100 has 2 GiB, its V100 is excluded
    assert passed(cache, service, claims, "any") == ["n1"]


def test_a_class_and_its_requests_selectors_both_apply() -> None:
    from gpupool.extender.gpupool_classes import GpupoolClasses

    cache, _service, claims = world(claim("both", request(device_class="a100-share",
                                                          selectors=[{"cel": {"expression": f"{A}.index == 0"}}])))
    GpupoolClasses(cache.claims, cache.lock).replace([A100_SHARE])
    obj = claim_pod("p", "both")
    gpu = claims.request(obj, pod_request(obj, ResourceNames())).gpu_containers[0].gpu
    assert gpu is not None and gpu.scope is not None and gpu.scope.within[0].uuids == {"GPU-n1-0", "GPU-n2-0"}
    GpupoolClasses(cache.claims, cache.lock).replace([device_class("a100-share", PINS, f'{A}.model == "{V100}"')])
    base = pod_request(obj, ResourceNames())
    assert claims.request(obj, base) is base  # a V100 of index 0: no card of the ledger, left as before


def test_a_class_that_changes_is_read_again_and_a_deleted_one_is_not_gpupools() -> None:
    cache, service, claims, watched = classes_world(A100_SHARE)
    assert passed(cache, service, claims, "by-class") == ["n2"]
    watched.apply("MODIFIED", device_class("a100-share", PINS, f'{A}.model == "{V100}"'))
    assert passed(cache, service, claims, "by-class") == ["n1"]  # n1's V100, the only one
    watched.apply("DELETED", A100_SHARE)
    obj = claim_pod("p", "by-class")
    base = pod_request(obj, ResourceNames())
    assert claims.request(obj, base) is base  # no class of gpupool's: nothing asked of its cards


def test_without_the_class_watch_an_admins_class_is_not_gpupools() -> None:
    _cache, _service, claims = world(claim("by-class", request(device_class="a100-share")))
    obj = claim_pod("p", "by-class")
    base = pod_request(obj, ResourceNames())
    assert claims.request(obj, base) is base


@pytest.mark.parametrize("expression", [
    f'{A}.model.matches("A100")',
    'device.attributes["resource.kubernetes.io"].pciBusID.startsWith("0000:3")',
])
def test_a_class_selector_outside_the_subset_leaves_its_claims_to_kube_scheduler_logged_once_per_class(
        expression: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gpupool.extender.gpupool_classes"):
        _cache, _service, claims, watched = classes_world(device_class("a100-share", PINS, expression))
        watched.apply("MODIFIED", device_class("a100-share", PINS, expression))  # a resync: told already
        watched.replace([device_class("a100-share", PINS, expression)])  # a relist: told already
    obj = claim_pod("p", "by-class")
    base = pod_request(obj, ResourceNames())
    assert claims.request(obj, base) is base
    told = [r.getMessage() for r in caplog.records if "a100-share" in r.getMessage()]
    assert len(told) == 1 and "selector not read" in told[0]


def test_a_claim_pod_waits_for_the_first_list_of_device_classes() -> None:
    from gpupool.extender.gpupool_classes import GpupoolClasses
    from gpupool.kube.translate import TranslationError

    cache, _service, claims = world(claim("by-class", request(device_class="a100-share")))
    cache.claims.classes_synced = False  # as start_class_watch leaves it until the list
    obj = claim_pod("p", "by-class")
    with pytest.raises(TranslationError, match="DeviceClasses"):
        claims.request(obj, pod_request(obj, ResourceNames()))
    GpupoolClasses(cache.claims, cache.lock).replace([A100_SHARE])
    gpu = claims.request(obj, pod_request(obj, ResourceNames())).gpu_containers[0].gpu
    assert gpu is not None and gpu.scope is not None and gpu.scope.within[0].uuids == {"GPU-n1-0", "GPU-n2-0"}


def test_readiness_waits_for_the_first_list_of_device_classes_when_watched() -> None:
    from gpupool.extender.gpupool_classes import GpupoolClasses

    cache, _service, _claims = world()
    assert cache.synced
    cache.claims.classes_synced = False  # start_class_watch
    assert not cache.synced
    GpupoolClasses(cache.claims, cache.lock).replace([])
    assert cache.synced and cache.claims.classes == {"gpu.gpupool.io"}
