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


def claiming_pod(resource_claims: list[Any], statuses: list[Any] | None = None) -> dict[str, Any]:
    """A pod whose containers use DRA claims: ``main`` uses ``gpu``, ``side`` uses ``gpu`` and ``scratch``,
    ``web`` none."""
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"nodeName": "n", "resourceClaims": resource_claims, "containers": [
                {"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
                {"name": "side", "resources": {"claims": [{"name": "gpu"}, {"name": "scratch", "request": "r"}]}},
                {"name": "web"}]},
            "status": {"resourceClaimStatuses": statuses or []}}


@pytest.mark.parametrize(("resource_claims", "statuses", "main", "side"), [
    pytest.param([{"name": "gpu", "resourceClaimName": "shared-gpu"}], None, ("shared-gpu",), ("shared-gpu",),
                 id="named-claim"),
    pytest.param([{"name": "gpu", "resourceClaimTemplateName": "t"}, {"name": "scratch", "resourceClaimName": "s"}],
                 [{"name": "gpu", "resourceClaimName": "p-gpu-x7k2"}], ("p-gpu-x7k2",), ("p-gpu-x7k2", "s"),
                 id="from-a-template-once-the-claim-exists"),
    pytest.param([{"name": "gpu", "resourceClaimTemplateName": "t"}], None, (), (), id="template-claim-not-made-yet"),
    pytest.param(["junk", {"resourceClaimName": "no-entry-name"}, {"name": "gpu"}], [{"name": "gpu"}, 7], (), (),
                 id="malformed-entries-are-skipped"),
])
def test_the_claims_each_container_uses(resource_claims: list[Any], statuses: list[Any] | None,
                                        main: tuple[str, ...], side: tuple[str, ...]) -> None:
    view = pod_view_from_json(claiming_pod(resource_claims, statuses), ResourceNames())
    assert [c.claims for c in view.containers] == [main, side, ()]
