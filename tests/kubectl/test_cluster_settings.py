"""``kubectl gpupool`` reads the cluster's ConfigMap and shows a node whose agent differs with the
extender's reason (gpupool/kubectl/cluster_settings.py)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpupool.api.cluster_settings import AGENT_SETTINGS_ANNOTATION, ClusterSettings
from gpupool.kube.translate import pod_request
from gpupool.kubectl.cluster_settings import PluginSettings, read_settings, with_settings_problems
from gpupool.kubectl.connection import Connection
from gpupool.kubectl.snapshot import build_snapshot
from gpupool.kubectl.why import explain
from tests.kubectl.objects import NAMES, gpu_node, gpu_pod


class ConfigMapApi:
    """``read_namespaced_config_map`` as the official client answers with ``_preload_content=False``."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def read_namespaced_config_map(self, name: str, namespace: str, **_: Any) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return SimpleNamespace(data=json.dumps({"metadata": {"name": name, "namespace": namespace},
                                                "data": self.answer}).encode())


def connection(answer: Any) -> Connection:
    return Connection(api=ConfigMapApi(answer), namespace="team")


def agent_node(name: str, settings: ClusterSettings) -> dict[str, Any]:
    node = gpu_node(name, [16384])
    node["metadata"]["annotations"][AGENT_SETTINGS_ANNOTATION] = settings.published()
    return node


def test_the_plugin_reads_the_config_map_and_the_domain_flag_overrides_it() -> None:
    read = read_settings(connection({"gpushareMemoryUnit": "MiB", "resourceDomain": "a.io"}),
                         "gpupool-system/gpupool-cluster", "b.io")
    assert read.settings == ClusterSettings(resource_domain="b.io", gpushare_memory_unit="MiB") and read.note is None


def test_no_config_map_leaves_the_defaults_with_a_note() -> None:
    read = read_settings(connection(ApiException(status=404, reason="Not Found")), "ns/cm", None)
    assert read.settings == ClusterSettings() and read.note is not None and read.note.startswith("no ConfigMap ns/cm")
    assert read_settings(connection(ApiException(status=500, reason="x")), "", "b.io") == PluginSettings(
        ClusterSettings(resource_domain="b.io"), "")


def test_a_config_map_it_may_not_read_leaves_the_defaults_with_a_note() -> None:
    read = read_settings(connection(ApiException(status=403, reason="Forbidden")), "gpupool-system/gpupool-cluster",
                         None)
    assert read.settings == ClusterSettings() and read.note is not None and "403 Forbidden" in read.note
    bad = read_settings(connection({"hami": "maybe"}), "gpupool-system/gpupool-cluster", None)
    assert bad.settings == ClusterSettings() and bad.note is not None and "hami" in bad.note


def test_why_names_a_node_whose_agent_differs_with_both_values() -> None:
    mib = dataclasses.replace(ClusterSettings(), gpushare_memory_unit="MiB")
    nodes = [agent_node("mib", mib), agent_node("same", ClusterSettings()), gpu_node("old", [16384])]
    read = PluginSettings(ClusterSettings(), "gpupool-system/gpupool-cluster")
    snapshot = with_settings_problems(build_snapshot(nodes, [], NAMES, now=0.0), nodes, read)
    answer = explain(snapshot, pod_request(gpu_pod("p", 16), NAMES))
    assert {name for name, _ in answer.fits} == {"same", "old"}
    (group,) = answer.groups
    ((node, reason),) = group.nodes
    assert node == "mib"
    assert "node mib counts gpushare memory (aliyun.com/gpu-mem) in MiB, the cluster configuration in GiB" in reason
    assert "Set gpushareMemoryUnit once in ConfigMap gpupool-system/gpupool-cluster" in reason


def test_nodes_that_agree_leave_the_snapshot_as_it_was() -> None:
    nodes = [agent_node("same", ClusterSettings())]
    snapshot = build_snapshot(nodes, [], NAMES, now=0.0)
    assert with_settings_problems(snapshot, nodes, PluginSettings(ClusterSettings(), "x/y")) is snapshot
