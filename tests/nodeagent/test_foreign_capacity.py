"""gpushare's card count (``aliyun.com/gpu-count``) in the node's status, where gpushare's names are
served: what the agent writes and when it writes nothing."""

from __future__ import annotations

from gpupool.api import names as n
from gpupool.nodeagent.foreign_capacity import capacity_patch, foreign_capacity

CARDS = 3


def test_a_node_serving_gpushare_publishes_its_card_count() -> None:
    assert foreign_capacity(("gpupool.io/gpu", n.ALIYUN_GPU_MEM), CARDS) == {"aliyun.com/gpu-count": "3"}
    assert capacity_patch({"aliyun.com/gpu-count": "3"}) == {
        "status": {"capacity": {"aliyun.com/gpu-count": "3"}, "allocatable": {"aliyun.com/gpu-count": "3"}}}


def test_other_nodes_publish_nothing() -> None:
    assert foreign_capacity(("gpupool.io/gpu", n.NVIDIA_GPU, n.TENCENT_VCUDA_CORE), CARDS) == {}
