"""A node's published topology reaches kube-scheduler: prioritize gives the better-linked node 10.

The node agent publishes the link matrix in ``inventory-v1``; for a 2-card pod, a node whose free
cards share a PCIe switch must outscore an otherwise equal node without topology (its cards are
taken as across sockets), in whichever order kube-scheduler lists them.
"""

from __future__ import annotations

import pytest

from gpupool.core.model import Topology
from gpupool.core.policies import POLICIES
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import MAX_EXTENDER_PRIORITY, ExtenderService
from gpupool.kube.translate import pod_request
from tests.kube.builders import container, node, pod

SWITCHED = Topology.from_tree([[0, 1], [2, 3]], 4)


@pytest.mark.parametrize("policy", [pytest.param(name, id=name) for name in sorted(POLICIES) if name != "random"])
@pytest.mark.parametrize("names", [pytest.param(["linked", "flat"], id="linked-first"),
                                   pytest.param(["flat", "linked"], id="flat-first")])
def test_prioritize_prefers_the_node_that_links_the_cards(policy: str, names: list[str]) -> None:
    cache = ClusterCache(policy=policy)
    cache.replace_nodes([node("linked", [16384] * 4, topology=SWITCHED), node("flat", [16384] * 4)])
    cache.replace_pods([])
    request = pod_request(pod("p", container(gpu=2)), cache.names)
    scores, error = ExtenderService(cache, None).prioritize(request, names)
    assert error == ""
    by_name = scores.as_dict()
    assert by_name["linked"] == MAX_EXTENDER_PRIORITY > by_name["flat"]
