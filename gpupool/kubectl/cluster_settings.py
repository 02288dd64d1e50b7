"""The cluster's shared settings as ``kubectl gpupool`` reads them, and the nodes whose agents differ.

The plugin reads pods with the names and units the extender reads them with, so it takes them from
the same ConfigMap (docs/cluster-config.md) with the user's credentials; ``--resource-domain``
overrides the domain as before. A ConfigMap it may not or cannot read leaves the defaults and a
note (the plugin explains; it must not stop for want of a permission). A node whose agent published
other values is shown with the extender's reason (:func:`gpupool.api.settings_check.settings_problem`),
compared with the ConfigMap's values: what the extender runs with unless a flag overrides them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.cluster_settings import ClusterSettings, ClusterSettingsError, Setting, from_config_data
from gpupool.api.settings_check import settings_problem
from gpupool.kube.cluster_config import parse_location
from gpupool.kubectl import connection as kube
from gpupool.kubectl.snapshot import ClusterSnapshot

WE = "the cluster configuration"
"""Who the reasons compare nodes with: the ConfigMap's values, not a running extender's."""


@dataclass(frozen=True)
class PluginSettings:
    """The settings the plugin reads with, where from, and why the defaults if they are."""

    settings: ClusterSettings
    config_map: str
    note: str | None = None


def read_settings(connection: kube.Connection, location: str, resource_domain: str | None) -> PluginSettings:
    """The ConfigMap's settings at ``location`` ("" reads none), ``resource_domain`` on top."""
    settings, note = ClusterSettings(), None
    if location:
        try:
            namespace, name = parse_location(location)
            data = kube.read_config_map(connection, namespace, name).get("data")
            settings = from_config_data(data, f"ConfigMap {location}")
        except kube.NotServedError:
            note = f"no ConfigMap {location}: the built-in defaults (docs/cluster-config.md)"
        except (kube.ClusterAccessError, ClusterSettingsError, ValueError) as exc:
            note = f"{exc}; reading pods with the built-in defaults (docs/cluster-config.md)"
    return PluginSettings(settings.overridden({Setting.RESOURCE_DOMAIN: resource_domain}), location, note)


def settings_problems(nodes: Iterable[Mapping[str, Any]], read: PluginSettings) -> dict[str, str]:
    """Per node whose agent published other settings than ``read``, the extender's reason."""
    found: dict[str, str] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        name, annotations = str(meta.get("name") or ""), meta.get("annotations") or {}
        if not name or not isinstance(annotations, Mapping):
            continue
        problem = settings_problem(name, annotations, read.settings, we=WE,
                                   config_map=read.config_map or "gpupool-system/gpupool-cluster")
        if problem is not None:
            found[name] = problem
    return found


def with_settings_problems(snapshot: ClusterSnapshot, nodes: Iterable[Mapping[str, Any]],
                           read: PluginSettings) -> ClusterSnapshot:
    """``snapshot`` with the nodes whose agents differ refused as the extender refuses them (an
    unreadable inventory keeps its own reason first)."""
    problems = settings_problems(nodes, read)
    if not problems:
        return snapshot
    return dataclasses.replace(snapshot, node_problems={**problems, **snapshot.node_problems})
