"""Memory written as a size where a resource counts units: which spellings are sizes, the count
each means, the JSON pointer of each value, and pods too malformed to read asking for nothing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.api.names import ResourceNames
from gpupool.kube.memory_quantity import is_size, size_rewrites, units_of_size, with_counts
from gpupool.kube.quantity import QuantityError

NAMES = ResourceNames()


@pytest.mark.parametrize(("value", "size"), [
    pytest.param("4Gi", True, id="binary"), pytest.param(" 1536Mi ", True, id="padded"),
    pytest.param("0.5Gi", True, id="fraction"), pytest.param("16", False, id="count"),
    pytest.param("4G", False, id="decimal-suffix"), pytest.param("1k", False, id="count-as-the-apiserver-writes-it"),
    pytest.param("4e9", False, id="exponent"), pytest.param("-4Gi", False, id="negative"),
    pytest.param(16, False, id="json-number"), pytest.param(None, False, id="null"),
])
def test_only_binary_suffixes_are_sizes(value: Any, size: bool) -> None:
    assert is_size(value) is size


@pytest.mark.parametrize(("value", "unit_mib", "count", "rounded"), [
    pytest.param("4Gi", 256, 16, False, id="4Gi"), pytest.param("1000Mi", 256, 4, True, id="rounded-up"),
    pytest.param("0Gi", 256, 0, False, id="zero"), pytest.param("8Gi", 1024, 8, False, id="gib-units"),
    pytest.param("1Ki", 256, 1, True, id="tiny"),
])
def test_the_count_of_a_size(value: str, unit_mib: int, count: int, rounded: bool) -> None:
    assert units_of_size(value, unit_mib) == (count, rounded)


def test_a_size_past_the_quantity_range_is_no_quantity() -> None:
    with pytest.raises(QuantityError):
        units_of_size("9999999999Ei", 256)
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"gpupool.io/gpu-mem": "9999999999Ei"}}}]}}
    assert size_rewrites(pod, NAMES) == ()  # left for the apiserver's validation


def test_the_pointer_escapes_the_resource_name_and_the_copy_leaves_the_pod_alone() -> None:
    pod = {"spec": {"containers": [{"name": "a"}, {"name": "b", "resources": {
        "limits": {"gpupool.io/gpu-mem": "2Gi", "cpu": "1Gi"}, "requests": {"tencent.com/vcuda-memory": "1Gi"}}}]}}
    found = size_rewrites(pod, NAMES)
    assert [r.path for r in found] == ["/spec/containers/1/resources/limits/gpupool.io~1gpu-mem",
                                       "/spec/containers/1/resources/requests/tencent.com~1vcuda-memory"]
    stored = with_counts(pod, found)
    assert stored["spec"]["containers"][1]["resources"]["limits"] == {"gpupool.io/gpu-mem": "8", "cpu": "1Gi"}
    assert pod["spec"]["containers"][1]["resources"]["limits"]["gpupool.io/gpu-mem"] == "2Gi"


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.just("4Gi"),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["spec", "containers", "initContainers", "name", "resources", "limits",
                                         "requests", "gpupool.io/gpu-mem", "x"]), inner, max_size=4),
                    max_leaves=20)


@pytest.mark.slow
@given(pod=st.dictionaries(st.sampled_from(["spec", "metadata"]), JSON, max_size=2))
def test_a_malformed_pod_never_crashes_the_reading(pod: dict[str, Any]) -> None:
    for rewrite in size_rewrites(pod, NAMES):
        assert rewrite.count >= 0 and rewrite.warning()


def test_hamis_mib_memory_is_rewritten_too() -> None:
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1",
                                                                         "nvidia.com/gpumem": "3Gi"}}}]}}
    (found,) = size_rewrites(pod, NAMES)
    assert (found.resource, found.count, found.rounded) == ("nvidia.com/gpumem", 3072, False)
    assert "nvidia.com/gpumem counts MiB: 3Gi rewritten as 3072 (3 GiB)" in found.warning()
