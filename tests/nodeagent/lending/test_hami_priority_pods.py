"""The node agent's pod feed reads HAMi's ``nvidia.com/priority`` as the pod's priority at open time
(0 high, 1 low), so the four lending rules rank HAMi pods as HAMi ranks them in a shared card."""

from __future__ import annotations

import pytest

from gpupool.api.lending import LendingNames, Priority
from gpupool.api.names import ResourceNames
from gpupool.nodeagent.lending.pods import lending_pod
from gpupool.nodeagent.node_pod import decode_node_pod


@pytest.mark.parametrize(("said", "spec_priority", "expected"), [
    pytest.param("0", 0, Priority.HIGH, id="zero-high-below-the-threshold"),
    pytest.param("1", 5000, Priority.LOW, id="one-low-above-the-threshold"),
])
def test_the_feed_reads_hamis_priority(said: str, spec_priority: int, expected: Priority) -> None:
    pod = {"metadata": {"name": "p", "namespace": "d", "uid": "u"},
           "spec": {"priority": spec_priority, "containers": [
               {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/priority": said}}}]},
           "status": {"containerStatuses": []}}
    record = decode_node_pod(pod, ResourceNames())
    assert record is not None
    found = lending_pod(record, LendingNames())
    assert found is not None and found.priority is expected
