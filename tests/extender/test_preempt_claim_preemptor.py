"""A claim pod as the preemptor (issue 24): a high-priority pod whose gpupool share comes from a
ResourceClaim gets GPU victims from the extender's preempt, through the same reading of its claims
that filter uses (:mod:`gpupool.extender.claim_pods`) and the same victim search as an
extended-resource pod. A pending claim is chosen for like an extended-resource pod of its share; an
allocated one makes the victims free the card its allocation names. Every test posts ``/preempt``
to the extender's HTTP API, as kube-scheduler does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gpupool.api.names import ResourceNames
from gpupool.extender.cache import ClusterCache
from gpupool.extender.claim_pods import ClaimPodRequests
from gpupool.extender.dra_watch import replace_claims
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService
from gpupool.kube.claim_holding import claim_key
from tests.extender.test_preempt_claims import CARD, DRIVER, GIB, HIGH, Recorded, claim, claim_pod, held, uid
from tests.kube.builders import container, node, placed_pod, pod


def pending(name: str, memory: str = "8Gi") -> dict[str, Any]:
    """A claim asking gpupool's class for ``memory`` of one card, not allocated yet."""
    ask = {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory}}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "default", "name": name, "uid": f"uid-claim-{name}"},
            "spec": {"devices": {"requests": [ask]}}, "status": {}}


def urgent(*claims: str, template: bool = False) -> dict[str, Any]:
    """The high-priority preemptor, pending, asking only for CPU and ``claims`` (made from a
    template: then named in its status, as the resourceclaim controller writes it)."""
    raw = pod("urgent", container(cpu="1"))
    raw["spec"]["priority"] = HIGH
    named = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    if template:
        raw["spec"]["resourceClaims"] = [{"name": n["name"], "resourceClaimTemplateName": "t"} for n in named]
        raw["status"]["resourceClaimStatuses"] = named
    else:
        raw["spec"]["resourceClaims"] = named
    raw["spec"]["containers"][0]["resources"]["claims"] = [{"name": n["name"]} for n in named]
    return raw


class World:
    """One or two nodes of 16 GiB cards, the pods and claims watched, the API built as the extender
    builds it with ``--dra-claims``."""

    def __init__(self, pods: list[dict[str, Any]], claims: list[dict[str, Any]], cards: int = 1,
                 nodes: tuple[str, ...] = ("N1",)) -> None:
        self.cache = ClusterCache(policy="binpack")
        self.cache.replace_nodes([node(name, [CARD] * cards) for name in nodes])
        self.cache.replace_pods(pods)
        replace_claims(self.cache, claims)
        self.answers = Recorded()
        service = ExtenderService(self.cache, None, preempt_answers=self.answers)
        self.api = ExtenderApi(service, ResourceNames(), ExtenderMetrics(),
                               claim_pods=ClaimPodRequests(self.cache.claims, self.cache.lock))

    def preempt(self, preemptor: dict[str, Any], proposed: Mapping[str, list[str]]) -> dict[str, set[str]]:
        """The answer to kube-scheduler's proposal, per node the victims' UIDs."""
        body = {"Pod": preemptor, "NodeNameToMetaVictims": {
            name: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for name, uids in proposed.items()}}

        async def main() -> Any:
            async with TestClient(TestServer(self.api.app())) as client:
                answer = await client.post("/preempt", data=json.dumps(body))
                assert answer.status == 200
                return await answer.json()

        result = asyncio.run(main())["NodeNameToMetaVictims"] or {}
        return {name: {p["UID"] for p in victims["Pods"]} for name, victims in result.items()}


# ----------------------------------------------------------------------------- a pending claim
def test_a_pending_claim_gets_the_victims_an_extended_resource_pod_of_its_share_gets() -> None:
    """One 16 GiB card, a low-priority pod holding 12 GiB: an 8 GiB claim needs it gone."""
    world = World([held("low", 0, 12 * GIB)], [pending("mine")])
    assert world.preempt(urgent("mine"), {"N1": []}) == {"N1": {uid("low")}}
    assert world.cache.state.placements.keys() >= {"default/low"}  # a what-if: nothing was lifted


def test_a_claim_made_from_a_template_is_read_through_the_pods_status() -> None:
    world = World([held("low", 0, 12 * GIB)], [pending("urgent-c0-x1")])
    assert world.preempt(urgent("urgent-c0-x1", template=True), {"N1": []}) == {"N1": {uid("low")}}


def test_the_pending_claims_victims_are_the_fewest_and_lowest_and_claims_freed_with_all_users() -> None:
    """Two cards: card 0 holds two 6 GiB pods of priority 0, card 1 one 12 GiB claim pod of
    priority 1 (its claim reserved for it alone). A 12 GiB claim takes card 1: one victim beats two,
    and the claim it frees is named for the follow-up; a pod at the preemptor's priority is never one."""
    pods = [held("a", 0, 6 * GIB), held("b", 0, 6 * GIB), claim_pod("cp", "c", priority=1)]
    world = World(pods, [claim("c", ["cp"], device="gpu-1", memory="12Gi"), pending("mine", "12Gi")], cards=2)
    assert world.preempt(urgent("mine"), {"N1": []}) == {"N1": {uid("cp")}}
    assert world.answers.answers["default/urgent"] == {"N1": {"default/cp", claim_key("default", "c")}}
    high = World([held("top", 0, 12 * GIB, priority=HIGH)], [pending("mine")])
    assert high.preempt(urgent("mine"), {"N1": []}) == {}


def test_a_pending_claim_that_fits_already_adds_no_victim() -> None:
    world = World([held("low", 0, 4 * GIB)], [pending("mine")])
    assert world.preempt(urgent("mine"), {"N1": ["uid-cpu"]}) == {"N1": {"uid-cpu"}}  # kube-scheduler's own stay


# --------------------------------------------------------------------------- an allocated claim
def test_an_allocated_claims_victims_free_the_card_its_allocation_names() -> None:
    """Card 0: a 12 GiB pod of priority 0; card 1: a 12 GiB pod of priority 5 and the preemptor's
    8 GiB claim the allocator put there (booked over capacity). An extended-resource pod of 8 GiB
    would evict the priority-0 pod; the claim needs card 1, so the priority-5 one goes."""
    pods = [held("cheap", 0, 12 * GIB), held("dear", 1, 12 * GIB, priority=5)]
    world = World(pods, [claim("mine", [], device="gpu-1", memory="8Gi")], cards=2)
    assert world.preempt(urgent("mine"), {"N1": []}) == {"N1": {uid("dear")}}
    assert claim_key("default", "mine") not in world.answers.answers["default/urgent"]["N1"]


def test_an_allocated_claim_is_answered_on_its_own_node_only() -> None:
    pods = [held("low", 0, 12 * GIB), placed_pod("low2", "N2", 0, 12 * GIB)]
    world = World(pods, [claim("mine", [], memory="8Gi")], nodes=("N1", "N2"))
    assert world.preempt(urgent("mine"), {"N1": [], "N2": []}) == {"N1": {uid("low")}}


def test_evicting_a_co_user_of_the_preemptors_own_claim_frees_nothing_for_it() -> None:
    """The preemptor shares an allocated claim with a low-priority pod on card 0, which a
    low-priority extended-resource pod over-commits: the extended-resource pod goes, the co-user
    stays, and the claim is not counted as freed (the preemptor keeps it)."""
    world = World([claim_pod("co", "shared"), held("ext", 0, 12 * GIB)], [claim("shared", ["co"], memory="8Gi")])
    assert world.preempt(urgent("shared"), {"N1": []}) == {"N1": {uid("ext")}}
    assert world.answers.answers["default/urgent"] == {"N1": {"default/ext"}}


def test_an_allocated_claim_that_fits_its_card_adds_no_victim_and_an_unreadable_one_no_node() -> None:
    world = World([held("low", 0, 4 * GIB)], [claim("mine", [], memory="8Gi")])
    assert world.preempt(urgent("mine"), {"N1": []}) == {}
    assert world.preempt(urgent("mine"), {"N1": ["uid-cpu"]}) == {"N1": {"uid-cpu"}}
    unreadable = World([held("low", 0, 12 * GIB)], [claim("mine", [], memory="lots")])
    assert unreadable.preempt(urgent("mine"), {"N1": [uid("low")]}) == {}
