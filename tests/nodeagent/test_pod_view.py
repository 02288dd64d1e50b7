"""A pod's GPU limits as the node agent reads them from the API (canonical quantities included)."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.names import ResourceNames
from gpupool.nodeagent.pod_view import pod_view_from_json

HAMI = ResourceNames(hami=True)


def pod(limits: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"nodeName": "n", "containers": [{"name": "main", "resources": {"limits": limits}}]}}


@pytest.mark.parametrize(("written", "read"), [
    pytest.param("3000", 3000, id="plain"),
    pytest.param("3k", 3000, id="as-the-apiserver-returns-3000"),
    pytest.param("1Ki", 1024, id="binary-suffix"),
])
def test_limits_are_read_in_the_apiservers_canonical_form(written: str, read: int) -> None:
    view = pod_view_from_json(pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": written}), HAMI)
    assert view.containers[0].limits == {"nvidia.com/gpu": 1, "nvidia.com/gpumem": read}


@pytest.mark.parametrize("written", ["1.5", "-2", "many"])
def test_a_limit_that_is_no_device_count_is_refused(written: str) -> None:
    with pytest.raises(ValueError, match="must be a whole number"):
        pod_view_from_json(pod({"gpupool.io/gpu-mem": written}), HAMI)
