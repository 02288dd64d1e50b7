"""Who may group what: a group naming a node the user may not modify is refused, naming the nodes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpupool.api.tenancy import GroupNode, ResourceGroup
from gpupool.kube.group_permission import (
    MAX_NAMED,
    Requester,
    permitted_nodes,
    refusal,
    sar_may_modify,
)


class FakeAuthorization:
    """Answers SubjectAccessReviews from a set of (user, verb, node) grants, recording each review; a
    grant on node "" covers every node (as an RBAC rule without resourceNames does), and a review
    without a name is allowed only by such a grant."""

    def __init__(self, grants: set[tuple[str, str, str]]) -> None:
        self.grants = grants
        self.reviews: list[dict[str, Any]] = []

    def create_subject_access_review(self, body: dict[str, Any]) -> Any:
        self.reviews.append(body)
        spec = body["spec"]
        attrs = spec["resourceAttributes"]
        assert attrs["resource"] == "nodes" and attrs["group"] == ""
        granted = {(spec["user"], attrs["verb"], attrs.get("name", "")), (spec["user"], attrs["verb"], "")}
        return SimpleNamespace(status=SimpleNamespace(allowed=bool(granted & self.grants)))

    def named(self) -> list[dict[str, Any]]:
        """The reviews that named a node."""
        return [r for r in self.reviews if "name" in r["spec"]["resourceAttributes"]]


def group(*nodes: str) -> ResourceGroup:
    return ResourceGroup("g", tuple(GroupNode(n, None) for n in nodes))


@pytest.mark.parametrize(("grants", "nodes", "expected"), [
    pytest.param({("alice", "update", "n1")}, ("n1",), None, id="update-allowed"),
    pytest.param({("alice", "patch", "n1")}, ("n1",), None, id="patch-alone-suffices"),
    pytest.param({("alice", "update", "n1")}, ("n1", "n2"),
                 "ResourceGroup g: alice may not modify node(s) n2 (update or patch on nodes), "
                 "so may not group them or their GPUs", id="one-node-forbidden-named"),
    pytest.param({("bob", "update", "n1")}, ("n1",), "alice may not modify node(s) n1", id="another-users-grant"),
    pytest.param(set(), (), None, id="empty-group"),
])
def test_refusal(grants: set[tuple[str, str, str]], nodes: tuple[str, ...], expected: str | None) -> None:
    verdict = refusal(group(*nodes), "alice", sar_may_modify(FakeAuthorization(grants), Requester("alice")))
    if expected is None:
        assert verdict is None
    else:
        assert verdict is not None and expected in verdict


def test_reviews_carry_the_users_groups_and_are_asked_once_per_node() -> None:
    api = FakeAuthorization({("alice", "update", "n1")})
    may = sar_may_modify(api, Requester("alice", ("team",)))
    assert may("n1") and may("n1")
    assert len(api.named()) == 1 and api.named()[0]["spec"]["groups"] == ["team"]
    assert len(api.reviews) == 3  # update and patch without a name first (not every node), then n1


def test_a_user_who_may_modify_every_node_costs_two_reviews_whatever_the_groups_size() -> None:
    api = FakeAuthorization({("admin", "patch", "")})
    may = sar_may_modify(api, Requester("admin"))
    assert refusal(group(*(f"n{i}" for i in range(500))), "admin", may) is None
    assert len(api.reviews) == 2 and not api.named()


@pytest.mark.parametrize(("before", "after", "expected"), [
    pytest.param(("n1", "n2"), ("n1",), "may not modify node(s) n2 (update or patch on nodes), so may not group "
                 "or ungroup them or their GPUs", id="removing-a-forbidden-node"),
    pytest.param(("n2",), ("n2",), "may not modify node(s) n2", id="changing-subjects-of-a-forbidden-group"),
    pytest.param(("n1",), ("n1", "n2"), "may not modify node(s) n2", id="adding-a-forbidden-node"),
    pytest.param(("n1",), ("n1",), None, id="own-nodes"),
    pytest.param(("n2",), None, "ResourceGroup g: alice may not modify node(s) n2", id="deleting-a-forbidden-group"),
])
def test_an_update_or_delete_counts_the_nodes_before_and_after(
        before: tuple[str, ...], after: tuple[str, ...] | None, expected: str | None) -> None:
    may = sar_may_modify(FakeAuthorization({("alice", "update", "n1")}), Requester("alice"))
    verdict = refusal(group(*after) if after is not None else None, "alice", may, before=group(*before))
    assert verdict == expected if expected is None else (verdict is not None and expected in verdict)


def test_long_refusals_count_the_rest() -> None:
    names = [f"n{i}" for i in range(MAX_NAMED + 5)]
    verdict = refusal(group(*names), "alice", lambda _: False)
    assert verdict is not None and "and 5 more" in verdict and f"n{MAX_NAMED}" not in verdict.split("(")[1]


def test_permitted_nodes_keep_order() -> None:
    assert permitted_nodes(["c", "a", "b"], lambda n: n != "a") == (["c", "b"], ["a"])
