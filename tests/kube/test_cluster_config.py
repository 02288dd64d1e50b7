"""Reading the cluster's ConfigMap (gpupool/kube/cluster_config.py): each answer of the API and what
the component runs with then."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import V1ConfigMap, V1ObjectMeta
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from gpupool.api.cluster_settings import ClusterSettings
from gpupool.kube.cluster_config import ClusterConfigError, parse_location, read_cluster_settings


class FakeCoreV1:
    """Answers ``read_namespaced_config_map`` with a ConfigMap or an error, and records the question."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str]] = []

    def read_namespaced_config_map(self, name: str, namespace: str, **_: Any) -> Any:
        self.asked.append((namespace, name))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def config_map(data: dict[str, str]) -> V1ConfigMap:
    return V1ConfigMap(metadata=V1ObjectMeta(name="gpupool-cluster", namespace="gpupool-system"), data=data)


def test_the_config_maps_values_are_read_from_its_place() -> None:
    api = FakeCoreV1(config_map({"gpushareMemoryUnit": "MiB"}))
    source = read_cluster_settings(api)
    assert source.found and source.settings == ClusterSettings(gpushare_memory_unit="MiB")
    assert api.asked == [("gpupool-system", "gpupool-cluster")]
    assert read_cluster_settings(FakeCoreV1({"data": {"hami": "true"}}), "ns/cm").settings.hami


@pytest.mark.parametrize(("status", "note"), [
    pytest.param(404, "no ConfigMap gpupool-system/gpupool-cluster", id="absent"),
    pytest.param(403, "not allowed to read", id="forbidden"),
])
def test_an_absent_or_forbidden_config_map_leaves_the_defaults(status: int, note: str) -> None:
    source = read_cluster_settings(FakeCoreV1(ApiException(status=status, reason="x")))
    assert not source.found and source.settings == ClusterSettings() and note in source.note


def test_no_config_map_asked_for_reads_nothing() -> None:
    api = FakeCoreV1(config_map({}))
    assert read_cluster_settings(api, "").settings == ClusterSettings() and api.asked == []


@pytest.mark.parametrize(("answer", "words"), [
    pytest.param(ApiException(status=500, reason="Internal Server Error"), "500 Internal Server Error", id="api-error"),
    pytest.param(MaxRetryError(None, "/api", "refused"), "cannot reach the API server", id="unreachable"),
    pytest.param(config_map({"hami": "maybe"}), "ConfigMap gpupool-system/gpupool-cluster: hami", id="bad-value"),
])
def test_what_cannot_be_read_stops_the_component_with_the_reason(answer: Any, words: str) -> None:
    with pytest.raises(ClusterConfigError, match=words):
        read_cluster_settings(FakeCoreV1(answer))


@pytest.mark.parametrize("text", ["gpupool-cluster", "/x", "ns/", "a/b/c"])
def test_a_location_is_namespace_slash_name(text: str) -> None:
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        parse_location(text)
