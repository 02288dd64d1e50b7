"""``why`` applies the extender's whole rule set, by the extender's own code: for the same cluster
and pod, every node the extender's filter refuses gets the same sentence from the plugin (groups,
quotas, pools, pinned and avoided GPUs, quota room per model), agent Leases lapse by the same rule
and words, loans are named with the borrower rule, and the policy is the one asked for."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpupool.api.agent_lease import DEFAULT_LEASE_NAMESPACE, lease_name
from gpupool.api.lending import Lendable, LendableCard, LendingNames, encode_lendable
from gpupool.api.tenancy import TenancyNames
from gpupool.extender.liveness import AgentLiveness
from gpupool.extender.service import ExtenderService
from gpupool.kube.tenancy import pod_tenancy
from gpupool.kube.tenancy_book import TenancyBook
from gpupool.kube.translate import pod_request
from gpupool.kubectl.rules import ClusterRules, lease_refusals, loan_notes, tenancy_book
from gpupool.kubectl.snapshot import build_snapshot
from gpupool.kubectl.why import Explanation, explain, why_text
from tests.extender.modes import EVERY_FIT
from tests.extender.tenancy_world import CARD, gpu_pod, group, namespace, pool_node, quota, world
from tests.kube.builders import node
from tests.kubectl.objects import assignment, placed
from tests.kubectl.objects import gpu_pod as bound_pod

NAMES = TenancyNames()
NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
NODES = [pool_node("n1", 2, "a"), pool_node("n2", 2, "b"), pool_node("n3", 2, "a", model="Tesla-T4")]
TEAM = group("team-a", {"n1": None, "n2": ["GPU-n2-1"]}, subjects=[{"kind": "Namespace", "name": "team-a"}])


def plugin(raw: dict[str, Any], *, groups: list[dict[str, Any]] = (), quotas: list[dict[str, Any]] = (),
           namespaces: list[dict[str, Any]] = (), pods: list[dict[str, Any]] = ()) -> Explanation:  # type: ignore[assignment]
    snapshot = build_snapshot(NODES, list(pods), world([]).names, now=NOW.timestamp())
    book = tenancy_book(TenancyBook(NAMES), groups, quotas, namespaces)
    request = pod_request(raw, world([]).names)
    return explain(snapshot, request, rules=ClusterRules(book), tenant=pod_tenancy(raw, NAMES), best=len(NODES))


def extender(raw: dict[str, Any], *, groups: list[dict[str, Any]] = (), quotas: list[dict[str, Any]] = (),
             namespaces: list[dict[str, Any]] = (), pods: list[dict[str, Any]] = ()  # type: ignore[assignment]
             ) -> tuple[set[str], dict[str, str]]:
    """The nodes the extender's filter passes, and its reason for every other node: asked a second
    time about those alone, since an answer that passes a node leaves out the nodes outside the
    pod's group or pools (a 5,000-node list kube-scheduler does not show)."""
    cache = world(NODES, groups=groups, quotas=quotas, namespaces=namespaces)
    cache.replace_pods(list(pods))
    request, tenant = pod_request(raw, cache.names), pod_tenancy(raw, NAMES)
    service = ExtenderService(cache, None, settings=EVERY_FIT)
    names = [n["metadata"]["name"] for n in NODES]
    passed = set(service.filter(request, names, frozenset(), tenant).passed)
    rest = [n for n in names if n not in passed]
    return passed, service.filter(request, rest, frozenset(), tenant).failed if rest else {}


def reasons(answer: Explanation) -> dict[str, str]:
    return {node: reason for g in answer.groups for node, reason in g.nodes}


SCENARIOS = [
    pytest.param(gpu_pod("p", "team-a", group_label="team-a", gpu_mem=4), {"groups": [TEAM]}, id="group"),
    pytest.param(gpu_pod("p", "team-a", group_label="nope", gpu_mem=4), {"groups": [TEAM]}, id="unknown-group"),
    pytest.param(gpu_pod("p", "team-b", group_label="team-a", gpu_mem=4), {"groups": [TEAM]}, id="not-admitted"),
    pytest.param(gpu_pod("p", "team-b", gpu_mem=4), {"groups": [TEAM]}, id="reserved-cards"),
    pytest.param(gpu_pod("p", "team-b", gpu_mem=4), {"namespaces": [namespace("team-b", "team-a")],
                                                     "groups": [TEAM]}, id="namespace-default-group"),
    pytest.param(gpu_pod("p", "team-a", gpu_mem=4), {"quotas": [quota("team-a", pools=["b"])]}, id="quota-pools"),
    pytest.param(gpu_pod("p", "team-a", whole=2), {"quotas": [quota("team-a", hard={"wholeGpus": 1})]},
                 id="quota-everywhere"),
    pytest.param(gpu_pod("p", "team-a", whole=1),
                 {"quotas": [quota("team-a", models={"Tesla-V100": {"wholeGpus": 1}}, hard={"wholeGpus": 4})],
                  "pods": [bound_pod("held", None, namespace="team-a", node="n1", phase="Running",
                                     limits={"gpupool.io/gpu": "1"},
                                     annotations=assignment("n1", 0, CARD, compute=1000, exclusive=True))]},
                 id="quota-room-per-model"),
    pytest.param(gpu_pod("p", "team-a", gpu_mem=4, annotations={"gpupool.io/gpu-uuids": "GPU-n3-0"}), {},
                 id="pinned-gpu"),
    pytest.param(gpu_pod("p", "team-a", gpu_mem=4, annotations={"gpupool.io/avoid-gpu-models": "Tesla-V100"}), {},
                 id="avoided-model"),
]


@pytest.mark.parametrize(("raw", "tenancy"), SCENARIOS)
def test_every_node_the_extender_refuses_gets_the_extenders_sentence(raw: dict[str, Any],
                                                                    tenancy: dict[str, Any]) -> None:
    passed, said = extender(raw, **tenancy)
    answer = plugin(raw, **tenancy)
    assert said, "the scenario must refuse some node"
    assert {n for n, _ in answer.fits} == passed
    if answer.everywhere is not None:
        assert set(said.values()) == {answer.everywhere}
    else:
        assert reasons(answer) == said


def test_the_text_names_the_rule() -> None:
    text = why_text(plugin(gpu_pod("p", "team-a", gpu_mem=4), quotas=[quota("team-a", pools=["b"])]), examples=3)
    assert "node is not in a pool GpuQuota team-a/gpus allows (b; node label gpupool.io/pool)" in text


# ----------------------------------------------------------------------------------- Leases
def lease(node_name: str, renewed: dt.datetime, duration: int = 40) -> dict[str, Any]:
    return {"metadata": {"name": lease_name(node_name), "namespace": DEFAULT_LEASE_NAMESPACE},
            "spec": {"holderIdentity": node_name, "leaseDurationSeconds": duration,
                     "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}


LEASES = [lease("n1", NOW - dt.timedelta(seconds=5)), lease("n2", NOW - dt.timedelta(seconds=300))]


@pytest.mark.parametrize("require", [False, True], ids=["lapsed-only", "required"])
def test_leases_lapse_as_the_extender_judges_a_first_sighting(require: bool) -> None:
    cache = world(NODES)
    liveness = AgentLiveness(DEFAULT_LEASE_NAMESPACE, require=require, monotonic=lambda: 1000.0, wall=lambda: NOW)
    liveness.replace(LEASES)
    names = ["n1", "n2", "n3"]
    assert lease_refusals(names, LEASES, DEFAULT_LEASE_NAMESPACE, require=require, now=NOW) == \
        dict(liveness.refusals(cache.state))


def test_a_lapsed_node_is_refused_with_the_leases_sentence() -> None:
    snapshot = build_snapshot(NODES, [], world([]).names, now=NOW.timestamp())
    refusals = lease_refusals(["n1", "n2", "n3"], LEASES, DEFAULT_LEASE_NAMESPACE, require=False, now=NOW)
    raw = gpu_pod("p", "team-a", gpu_mem=4)
    answer = explain(snapshot, pod_request(raw, world([]).names), rules=ClusterRules(node_refusals=refusals))
    assert reasons(answer)["n2"].startswith("node agent on n2 last renewed 300 s ago (lease 40 s)")
    assert "n2" not in {n for n, _ in answer.fits}


# ------------------------------------------------------------------------------------ loans
def lending_node() -> dict[str, Any]:
    found = node("lender", [CARD])
    card = LendableCard(0, "GPU-lender-0", "team-x/owner", "main", CARD, 100, NOW.timestamp())
    found["metadata"]["annotations"][LendingNames().lendable] = encode_lendable(Lendable(NOW.timestamp(), (card,)))
    return found


@pytest.mark.parametrize(("annotations", "owned", "note"), [
    pytest.param({"gpupool.io/borrow": "true"}, False, "which this pod may borrow if its request fits one",
                 id="willing"),
    pytest.param({}, False, "not for this pod: a pod without a controller borrows only with gpupool.io/borrow",
                 id="bare-pod"),
    pytest.param({"gpupool.io/borrow": "true", "gpupool.io/priority": "high"}, False,
                 "not for this pod: a high-priority pod does not borrow", id="high-priority"),
    pytest.param({}, True, "which this pod may borrow", id="controlled"),
])
def test_lent_cards_are_named_with_the_borrower_rule(annotations: dict[str, str], owned: bool, note: str) -> None:
    raw = gpu_pod("p", "team-a", gpu_mem=4, annotations=annotations)
    if owned:
        raw["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": "u", "controller": True}]
    notes = loan_notes([lending_node(), node("plain", [CARD])], raw, None, LendingNames())
    assert list(notes) == ["lender"] and note in notes["lender"]
    assert notes["lender"].startswith("; 1 card(s) lent here by their owners")


# ----------------------------------------------------------------------------------- policy
def test_the_fits_are_ranked_by_the_policy_asked_for() -> None:
    snapshot = build_snapshot(NODES, [placed("held", "n1", 0, 8, namespace="team-a")], world([]).names,
                              now=NOW.timestamp())
    request = pod_request(gpu_pod("p", "team-a", gpu_mem=4), world([]).names)
    packed = explain(snapshot, request, policy="binpack", best=1)
    spread = explain(snapshot, request, policy="spread", best=1)
    assert (packed.policy, packed.fits[0][0]) == ("binpack", "n1")
    assert spread.policy == "spread" and spread.fits[0][0] != "n1"
    assert "best by policy spread:" in why_text(spread, examples=3)
