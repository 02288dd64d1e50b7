"""User and Group subjects of a ResourceGroup, enforced at pod admission: the pod's creator (or
whoever sets its group label) must be among the subjects unless its namespace or ServiceAccount is;
the filter then trusts the label of a group with such subjects only where that webhook checks it."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.tenancy import TenancyNames
from gpupool.extender.admission import Verdict
from gpupool.extender.cache import ClusterCache
from gpupool.extender.group_subjects import GroupSubjectAdmission
from gpupool.extender.service import ExtenderService
from tests.extender.tenancy_world import gpu_pod, group, namespace, read, world
from tests.kube.builders import node

CARD = 16_384
NODES = ["n1", "n2"]
ALICE_OR_ML = group("gpu-a", {"n1": None}, subjects=[
    {"kind": "User", "name": "alice"}, {"kind": "Group", "name": "ml-team"},
    {"kind": "Namespace", "name": "team-a"}])
PLAIN = group("plain", {"n2": None}, subjects=[{"kind": "Namespace", "name": "team-a"}])


def cluster(*groups: dict[str, Any]) -> ClusterCache:
    return world([node(n, [CARD, CARD]) for n in NODES], groups=list(groups) or [ALICE_OR_ML, PLAIN])


def judge(cache: ClusterCache, raw: dict[str, Any], user: str, groups: tuple[str, ...] = (),
          old: dict[str, Any] | None = None) -> Verdict:
    return GroupSubjectAdmission(cache, TenancyNames()).review(raw, old, raw["metadata"]["namespace"], user, groups)


@pytest.mark.parametrize(("ns", "user", "groups", "allowed"), [
    pytest.param("team-b", "alice", (), True, id="user-subject"),
    pytest.param("team-b", "bob", ("ml-team", "system:authenticated"), True, id="group-subject"),
    pytest.param("team-a", "bob", (), True, id="namespace-subject"),
    pytest.param("team-b", "bob", ("system:authenticated",), False, id="neither"),
])
def test_the_creator_or_the_pods_namespace_must_be_a_subject(ns: str, user: str, groups: tuple[str, ...],
                                                              allowed: bool) -> None:
    found = judge(cluster(), gpu_pod("p", ns, group_label="gpu-a", whole=1), user, groups)
    assert found.allowed is allowed
    if not allowed:
        assert found.reason.startswith("resource group gpu-a admits neither namespace team-b (ServiceAccount "
                                       "default) nor the requester bob: its subjects are User alice, Group ml-team, "
                                       "Namespace team-a")


def test_pods_without_a_group_label_and_updates_keeping_it_are_not_judged() -> None:
    cache = cluster()
    assert judge(cache, gpu_pod("p", "team-b", whole=1), "bob").allowed
    labelled = gpu_pod("p", "team-b", group_label="gpu-a", whole=1)
    assert judge(cache, labelled, "bob", old=labelled).allowed  # e.g. the scheduler's or kubelet's update
    relabelled = judge(cache, labelled, "bob", old=gpu_pod("p", "team-b", group_label="plain", whole=1))
    assert not relabelled.allowed  # setting or changing the label is judged like a create


@pytest.mark.parametrize(("groups", "label", "reason"), [
    pytest.param([PLAIN], "nope", "resource group nope does not exist (label gpupool.io/group); create the group "
                 "before the pods that name it", id="missing"),
    pytest.param([PLAIN], "plain", "resource group plain admits neither namespace team-b", id="namespace-only-group"),
    pytest.param([{**PLAIN, "metadata": {"name": "bad"}, "spec": {"nodes": "n1"}}], "bad",
                 "ResourceGroup bad cannot be read: ", id="unreadable"),
])
def test_a_pod_the_group_cannot_admit_now_is_refused(groups: list[dict[str, Any]], label: str, reason: str) -> None:
    found = judge(cluster(*groups), gpu_pod("p", "team-b", group_label=label, whole=1), "alice")
    assert not found.allowed and found.reason.startswith(reason), found.reason


def test_before_the_groups_are_listed_a_labelled_pod_is_refused_with_a_retry() -> None:
    cache = cluster()
    cache.tenancy.synced.discard("groups")
    found = judge(cache, gpu_pod("p", "team-a", group_label="gpu-a", whole=1), "alice")
    assert not found.allowed and "retry in a moment" in found.reason


class Api:
    """The API's groups for the confirming read, and the names it was asked for."""

    def __init__(self, *groups: dict[str, Any], fails: bool = False) -> None:
        self.groups = {g["metadata"]["name"]: g for g in groups}
        self.fails = fails
        self.asked: list[tuple[str, float]] = []

    def read(self, name: str, timeout_s: float) -> dict[str, Any] | None:
        self.asked.append((name, timeout_s))
        if self.fails:
            raise TimeoutError("read timed out")
        return self.groups.get(name)


def confirmed(cache: ClusterCache, api: Api, raw: dict[str, Any], user: str) -> Verdict:
    admission = GroupSubjectAdmission(cache, TenancyNames(), api.read)
    assert admission.blocking
    return admission.review(raw, None, raw["metadata"]["namespace"], user, ())


NEW = group("new", {"n1": None}, subjects=[{"kind": "User", "name": "alice"}])


def test_a_group_the_watch_has_not_delivered_yet_is_read_from_the_api_before_a_refusal() -> None:
    # kubectl apply of a group and a pod naming it: the cache may not have the group yet
    api = Api(NEW, PLAIN)
    raw = gpu_pod("p", "team-b", group_label="new", whole=1)
    assert not judge(cluster(PLAIN), raw, "alice").allowed  # the cache alone refuses
    assert confirmed(cluster(PLAIN), api, raw, "alice").allowed
    assert api.asked == [("new", 1.0)]
    # the same read before the groups were listed
    unsynced = cluster(PLAIN)
    unsynced.tenancy.synced.discard("groups")
    assert confirmed(unsynced, api, raw, "alice").allowed
    # a subject added a moment ago counts too; the API's refusal is the one given
    widened = {**PLAIN, "spec": {**PLAIN["spec"], "subjects": [*PLAIN["spec"]["subjects"],
                                                                {"kind": "User", "name": "bob"}]}}
    plain_pod = gpu_pod("q", "team-b", group_label="plain", whole=1)
    assert confirmed(cluster(PLAIN), Api(widened), plain_pod, "bob").allowed
    refused = confirmed(cluster(PLAIN), Api(widened), plain_pod, "carol")
    assert not refused.allowed and "its subjects are Namespace team-a, User bob" in refused.reason


def test_a_pod_the_cache_admits_costs_no_read_and_a_failed_read_keeps_the_caches_refusal() -> None:
    api = Api(NEW, ALICE_OR_ML, PLAIN)
    assert confirmed(cluster(), api, gpu_pod("p", "team-b", group_label="gpu-a", whole=1), "alice").allowed
    assert api.asked == []
    raw = gpu_pod("p", "team-b", group_label="new", whole=1)
    failing = confirmed(cluster(), Api(NEW, fails=True), raw, "alice")
    assert not failing.allowed and failing.reason.startswith("resource group new does not exist")
    absent = confirmed(cluster(), Api(), raw, "alice")
    assert not absent.allowed and absent.reason.startswith("resource group new does not exist")
    broken = confirmed(cluster(), Api({**NEW, "spec": {"nodes": "n1"}}), raw, "alice")
    assert not broken.allowed and broken.reason.startswith("ResourceGroup new cannot be read: ")
    assert not GroupSubjectAdmission(cluster(), TenancyNames()).blocking


def filter_passed(cache: ClusterCache, raw: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    request, tenant = read(cache, raw)
    outcome = ExtenderService(cache, None).filter(request, NODES, frozenset(), tenant)
    return outcome.passed, outcome.failed


def test_the_filter_trusts_a_labelled_pod_of_a_creator_group_only_where_the_webhook_checks_it() -> None:
    raw = gpu_pod("p", "team-b", group_label="gpu-a", whole=1)
    unchecked = cluster()
    passed, failed = filter_passed(unchecked, raw)
    assert passed == [] and failed["n1"].startswith("resource group gpu-a does not admit namespace team-b")
    assert "matched only by the extender's pod-group webhook" in failed["n1"]
    checked = cluster()
    checked.admissions.creators_checked = True
    assert filter_passed(checked, raw)[0] == ["n1"]
    # a group without User or Group subjects is still matched on the pod at every filter
    passed, failed = filter_passed(checked, gpu_pod("q", "team-b", group_label="plain", whole=1))
    assert passed == [] and failed["n2"] == "resource group plain does not admit namespace team-b " \
                                            "(ServiceAccount default)"


def test_a_namespace_default_group_is_not_opened_by_user_subjects() -> None:
    cache = world([node(n, [CARD, CARD]) for n in NODES], groups=[ALICE_OR_ML],
                  namespaces=[namespace("team-b", "gpu-a")])
    cache.admissions.creators_checked = True
    passed, failed = filter_passed(cache, gpu_pod("p", "team-b", whole=1))  # no label: the webhook never saw it
    assert passed == [] and "its User and Group subjects admit only pods that name the group" in failed["n1"]
