"""A pod holding gpupool's card through a DRA ResourceClaim is a preemption victim like an
extended-resource pod of its priority (issue 24): the answer names the pod, the what-if frees its
claim's share (what the allocation holds) only when every pod the claim is reserved for is a victim,
and the preemptor is retried once the claim's booking is released too."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import pytest

from gpupool.core.model import PodRequest
from gpupool.extender.cache import ClusterCache
from gpupool.extender.dra_watch import apply_claim_event, replace_claims
from gpupool.extender.service import ExtenderService
from gpupool.kube.claim_holding import claim_key, read_claim
from gpupool.kube.translate import pod_request
from tests.kube.builders import container, node, placed_pod, pod

DRIVER = "gpu.gpupool.io"
GIB = 1024  # MiB
CARD = 16 * GIB
HIGH = 1000


def claim(name: str, users: list[str], *, device: str = "gpu-0", memory: str | None = "12Gi",
          node_name: str = "N1", reserved: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A claim allocated on ``device`` of ``node_name``, reserved for the pods ``users`` (names)."""
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": node_name, "device": device}
    if memory is not None:
        result["consumedCapacity"] = {"memory": memory}
    status: dict[str, Any] = {"allocation": {"devices": {"results": [result]}}}
    status["reservedFor"] = reserved if reserved is not None else [
        {"resource": "pods", "name": user, "uid": uid(user)} for user in users]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "default", "name": name, "uid": f"uid-claim-{name}"}, "status": status}


def claim_pod(name: str, claim_name: str, *, priority: int = 0, node_name: str = "N1") -> dict[str, Any]:
    """A bound pod without gpupool's extended resources, using claim ``claim_name``."""
    raw = pod(name, container(cpu="1"), node_name=node_name, phase="Running")
    raw["spec"]["priority"] = priority
    raw["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    raw["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return raw


def held(name: str, card: int, mib: int, *, priority: int = 0) -> dict[str, Any]:
    raw = placed_pod(name, "N1", card, mib)
    raw["spec"]["priority"] = priority
    return raw


def uid(name: str) -> str:
    return f"uid-default-{name}"


def preemptor(mib: int, priority: int = HIGH) -> PodRequest:
    raw = pod("p", container(mib=mib, cpu="1"))
    raw["spec"]["priority"] = priority
    return pod_request(raw, ClusterCache().names)


class Recorded:
    """A :class:`gpupool.extender.preemption.PreemptAnswers` that keeps what it was told."""

    def __init__(self) -> None:
        self.answers: dict[str, dict[str, set[str]]] = {}

    def remember(self, key: str, victims: Mapping[str, Collection[str]]) -> None:
        self.answers[key] = {node: set(keys) for node, keys in victims.items()}

    def awaiting(self, key: str) -> bool:
        return False


def ledger(pods: list[dict[str, Any]], claims: list[dict[str, Any]],
           cards: list[int] | None = None) -> tuple[ExtenderService, ClusterCache, Recorded]:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("N1", cards or [CARD])])
    cache.replace_pods(pods)
    replace_claims(cache, claims)
    answers = Recorded()
    return ExtenderService(cache, None, preempt_answers=answers), cache, answers


def victims_of(service: ExtenderService, mib: int, priority: int = HIGH) -> set[str] | None:
    answer, error = service.preempt(preemptor(mib, priority), {"N1": []})
    assert error == ""
    return set(answer["N1"]) if "N1" in answer else None


# ------------------------------------------------------------------------------------ reading
def test_a_claim_record_keeps_the_uids_it_is_reserved_for() -> None:
    record = read_claim(claim("c", ["a", "b"]), DRIVER)
    assert record is not None and record.users == (uid("a"), uid("b"))
    unreadable = claim("c", ["a"], memory="lots")
    record = read_claim(unreadable, DRIVER)
    assert record is not None and record.problem is not None and record.users == (uid("a"),)


# ----------------------------------------------------------------------------------- choosing
def test_a_claim_pod_of_lower_priority_is_named_and_its_claims_share_freed() -> None:
    service, cache, answers = ledger([claim_pod("cp", "c")], [claim("c", ["cp"])])
    placements = dict(cache.state.placements)
    assert victims_of(service, 8 * GIB) == {uid("cp")}
    assert answers.answers["default/p"] == {"N1": {"default/cp", claim_key("default", "c")}}
    assert cache.state.placements == placements  # a what-if: the ledger still books the claim


def test_the_lower_priority_holder_is_chosen_whichever_path_placed_it() -> None:
    """Two cards, an extended-resource pod on one and a claim pod on the other, both 12 GiB."""
    cards = [CARD, CARD]
    claims = [claim("c", ["cp"], device="gpu-1")]
    service, _, _ = ledger([held("e", 0, 12 * GIB, priority=5), claim_pod("cp", "c", priority=1)], claims, cards)
    assert victims_of(service, 8 * GIB) == {uid("cp")}
    service, _, _ = ledger([held("e", 0, 12 * GIB, priority=1), claim_pod("cp", "c", priority=5)], claims, cards)
    assert victims_of(service, 8 * GIB) == {uid("e")}


def test_a_claim_pod_of_the_preemptors_priority_or_above_is_never_a_victim() -> None:
    service, _, _ = ledger([claim_pod("cp", "c", priority=HIGH)], [claim("c", ["cp"])])
    assert victims_of(service, 8 * GIB) is None


@pytest.mark.parametrize(("second", "victims"), [
    pytest.param(0, {"a", "b"}, id="both-users-low-both-named"),
    pytest.param(HIGH, None, id="a-user-at-the-preemptors-priority-keeps-the-claim"),
])
def test_a_shared_claim_is_freed_only_when_all_its_users_are_victims(second: int, victims: set[str] | None) -> None:
    service, _, _ = ledger([claim_pod("a", "c"), claim_pod("b", "c", priority=second)], [claim("c", ["a", "b"])])
    assert victims_of(service, 8 * GIB) == (None if victims is None else {uid(v) for v in victims})


@pytest.mark.parametrize("reserved", [
    pytest.param([{"resource": "pods", "name": "cp", "uid": uid("cp")},
                  {"resource": "pods", "name": "pending", "uid": uid("pending")}], id="a-user-not-bound-here"),
    pytest.param([{"resource": "pods", "name": "cp", "uid": uid("cp")},
                  {"apiGroup": "example.com", "resource": "jobs", "name": "j", "uid": "uid-job"}],
                 id="a-consumer-that-is-no-pod"),
    pytest.param([], id="reserved-for-nobody"),
])
def test_a_claim_some_consumer_of_which_cannot_be_evicted_is_never_freed(reserved: list[dict[str, Any]]) -> None:
    service, _, _ = ledger([claim_pod("cp", "c")], [claim("c", [], reserved=reserved)])
    assert victims_of(service, 8 * GIB) is None


def test_a_claim_frees_what_its_allocation_holds() -> None:
    """A 16 GiB card: an 8 GiB pod of the preemptor's priority and a 4 GiB claim of a low one. The
    claim frees 4 GiB, enough for an 8 GiB pod and not for a 9 GiB one; a claim allocated without
    consumed capacity holds (and frees) the whole card."""
    pods = [held("e", 0, 8 * GIB, priority=HIGH), claim_pod("cp", "c")]
    service, _, _ = ledger(pods, [claim("c", ["cp"], memory="4Gi")])
    assert victims_of(service, 8 * GIB) == {uid("cp")}
    assert victims_of(service, 9 * GIB) is None
    service, _, _ = ledger([claim_pod("cp", "c")], [claim("c", ["cp"], memory=None)])
    assert victims_of(service, CARD) == {uid("cp")}


def test_only_the_claim_pod_on_the_card_the_preemptor_needs_is_evicted() -> None:
    """Card 0 holds two small claims, card 1 one large one: the single large one goes."""
    claims = [claim("c0", ["a"], memory="6Gi"), claim("c1", ["b"], memory="6Gi"),
              claim("c2", ["c"], device="gpu-1", memory="12Gi")]
    pods = [claim_pod("a", "c0"), claim_pod("b", "c1"), claim_pod("c", "c2")]
    service, _, _ = ledger(pods, claims, [CARD, CARD])
    assert victims_of(service, 12 * GIB) == {uid("c")}


def test_an_unreadable_claim_keeps_its_node_closed_unless_all_its_users_are_victims() -> None:
    """Like a pod whose assignment cannot be read: its share is unknown, so the node takes no GPU
    pod, unless the victims include every pod it is reserved for (kube-scheduler's proposal)."""
    service, _, _ = ledger([claim_pod("cp", "c")], [claim("c", ["cp"], memory="lots")])
    answer, _ = service.preempt(preemptor(8 * GIB), {"N1": []})
    assert answer == {}
    answer, _ = service.preempt(preemptor(8 * GIB), {"N1": [uid("cp")]})
    assert answer == {"N1": [uid("cp")]}


# ------------------------------------------------------------------------------- the follow-up
def test_the_claims_release_is_announced_so_the_preemptor_is_retried_after_it() -> None:
    """The pod's delete releases its own booking first; the card is free only when the
    resourceclaim controller has deallocated the claim, which the release listeners hear of."""
    _, cache, _ = ledger([claim_pod("cp", "c")], [claim("c", ["cp"])])
    heard: list[str] = []
    cache.release_listeners.append(heard.append)
    apply_claim_event(cache, "MODIFIED", claim("c", ["cp"], memory="8Gi"))  # re-booked: no release
    assert heard == []
    deallocated = claim("c", [])
    del deallocated["status"]["allocation"]
    apply_claim_event(cache, "MODIFIED", deallocated)
    assert heard == [claim_key("default", "c")]
