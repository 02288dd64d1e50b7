"""Automatic grouping (seed 002): by GPU model, a model cut in N, and by expected demand, best fit."""

from __future__ import annotations

import pytest

from gpupool.api.tenancy import GroupNode, decode_group
from gpupool.core.model import GpuCard, NodeSpec
from gpupool.kube.group_proposal import Demand, ProposalError, ProposalRequest, group_name, manifest, propose


def node(name: str, *models: str, sick: tuple[int, ...] = ()) -> NodeSpec:
    cards = tuple(GpuCard(i, f"{name}-{i}", m, 16_384, healthy=i not in sick) for i, m in enumerate(models))
    return NodeSpec(name, 64_000, 256_000, cards)


CLUSTER = [node("a", "T4", "T4", "T4", "T4"), node("b", "T4", "T4"), node("c", "A100", "A100", "T4"),
           node("d", "A100", "A100", "A100", "A100", "A100", "A100", "A100", "A100")]


def layout(request: ProposalRequest, nodes: list[NodeSpec] = CLUSTER) -> dict[str, list[tuple[str, int | None]]]:
    """group -> [(node, listed GPU count or None for the whole node)]."""
    return {g.name: [(n.name, None if n.gpus is None else len(n.gpus)) for n in g.nodes]
            for g in propose(nodes, request)}


@pytest.mark.parametrize(("request_", "expected"), [
    pytest.param(ProposalRequest(by_model=True),
                 {"model-a100": [("c", 2), ("d", None)], "model-t4": [("a", None), ("b", None), ("c", 1)]},
                 id="one-group-per-model-mixed-node-lists-uuids"),
    pytest.param(ProposalRequest(by_model=True, split=2),
                 {"model-a100-1": [("c", 2), ("d", 3)], "model-a100-2": [("d", 5)],
                  "model-t4-1": [("a", None)], "model-t4-2": [("b", None), ("c", 1)]},
                 id="split-in-two-sizes-differ-by-at-most-one"),
    pytest.param(ProposalRequest(demands=(Demand("team-x", 2),)),
                 {"team-x": [("b", None)]}, id="demand-best-fit-takes-the-tightest-node"),
    pytest.param(ProposalRequest(demands=(Demand("big", 10, "A100"),)),
                 {"big": [("c", 2), ("d", None)]}, id="demand-past-every-node-largest-first-then-best-fit"),
    pytest.param(ProposalRequest(demands=(Demand("t", 3, "T4"), Demand("u", 3, "T4"))),
                 {"t": [("a", 3)], "u": [("a", 1), ("b", None)]}, id="two-demands-share-out-a-model"),
    pytest.param(ProposalRequest(by_model=True, demands=(Demand("one", 5),)),
                 {"one": [("a", None), ("c", 1)]}, id="by-model-with-demand-keeps-a-team-on-one-model"),
])
def test_proposals(request_: ProposalRequest, expected: dict[str, list[tuple[str, int | None]]]) -> None:
    assert layout(request_) == expected


def test_split_sizes_are_balanced_and_cover_every_gpu_once() -> None:
    groups = propose(CLUSTER, ProposalRequest(by_model=True, split=3))
    a100 = [g for g in groups if g.name.startswith("model-a100")]
    sizes = [sum(len(n.gpus) if n.gpus is not None else 8 for n in g.nodes) for g in a100]
    assert sorted(sizes) == [3, 3, 4]


def test_unhealthy_gpus_are_not_proposed_and_the_node_is_listed_by_uuid() -> None:
    (group,) = propose([node("n", "T4", "T4", sick=(1,))], ProposalRequest(by_model=True))
    assert group.nodes == (GroupNode("n", None),)  # every healthy GPU: listed by name
    (group,) = propose([node("n", "T4", "T4", "A100", sick=(1,))], ProposalRequest(demands=(Demand("t", 1, "T4"),)))
    assert group.nodes == (GroupNode("n", frozenset({"n-0"})),)


def test_demand_groups_are_unshared_and_name_the_team_namespace() -> None:
    (group,) = propose(CLUSTER, ProposalRequest(demands=(Demand("Team_X", 1, namespaces=("ns1", "ns2")),)))
    assert group.name == "team-x" and not group.shared
    assert [s.name for s in group.subjects] == ["ns1", "ns2"]
    (default,) = propose(CLUSTER, ProposalRequest(demands=(Demand("team-y", 1),)))
    assert [(s.kind, s.name) for s in default.subjects] == [("Namespace", "team-y")]


def test_manifests_decode_with_the_extenders_codec() -> None:
    for group in propose(CLUSTER, ProposalRequest(by_model=True, split=2)):
        assert decode_group(manifest(group)) == group
        assert manifest(group)["apiVersion"] == "gpupool.io/v1alpha1"


@pytest.mark.parametrize(("request_", "message"), [
    pytest.param(ProposalRequest(), "nothing to group by", id="no-criterion"),
    pytest.param(ProposalRequest(by_model=True, split=0), "split must be", id="split-zero"),
    pytest.param(ProposalRequest(by_model=True, split=5), "cannot cut the 1 GPU(s) of model A100", id="split-too-fine"),
    pytest.param(ProposalRequest(demands=(Demand("t", 99, "T4"),)), "team t expects 99 GPUs of model T4",
                 id="demand-too-large"),
    pytest.param(ProposalRequest(demands=(Demand("t", 1, "H100"),)), "no healthy GPU of model H100",
                 id="unknown-model"),
    pytest.param(ProposalRequest(demands=(Demand("t", 3), Demand("u", 2))), "team u expects 2 GPUs",
                 id="second-demand-finds-too-little-left"),
    pytest.param(ProposalRequest(demands=(Demand("A", 1), Demand("a", 1))), "share a name", id="names-clash"),
])
def test_refused_proposals_say_why(request_: ProposalRequest, message: str) -> None:
    nodes = [node("a", "T4", "T4"), node("b", "T4", "A100")]
    with pytest.raises(ProposalError, match=message.replace("(", r"\(").replace(")", r"\)")):
        propose(nodes, request_)


@pytest.mark.parametrize(("parts", "expected"), [
    pytest.param(("model", "Tesla V100-SXM2-16GB"), "model-tesla-v100-sxm2-16gb", id="spaces-and-case"),
    pytest.param(("",), "group", id="empty"),
    pytest.param(("x" * 100,), "x" * 63, id="too-long"),
])
def test_group_names_are_dns_labels(parts: tuple[str, ...], expected: str) -> None:
    assert group_name(*parts) == expected
