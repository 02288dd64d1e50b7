"""Read the cluster's shared settings from their ConfigMap (:mod:`gpupool.api.cluster_settings`).

Read once, when a component starts: the settings decide how every pod is read, so a component
changes them only by restarting (the node agents' published values and the extender's check catch
a component that has not restarted yet; docs/cluster-config.md).

What each answer means:

* the ConfigMap is there: its values (a bad one is an error that names the key);
* 404, no such ConfigMap: the built-in defaults, which are the shipped command-line defaults;
* 403, not allowed to read it (an older RBAC, a user without ``get`` on it): the defaults too,
  with a warning, since the check on the agents' published values still refuses a node that
  differs; a component must not fail to start for want of a permission it did not need before;
* anything else (API unreachable, a timeout): :class:`ClusterConfigError`, and the component does
  not start, rather than guess values that would misread pods.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpupool.api.cluster_settings import CONFIG_MAP, ClusterSettings, ClusterSettingsError, from_config_data

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 10.0


class ClusterConfigError(RuntimeError):
    """The ConfigMap could not be read or holds a bad value; the message says which and why."""


@dataclass(frozen=True)
class ConfigSource:
    """Where the settings came from, for the start-up log and for messages."""

    settings: ClusterSettings
    config_map: str
    """``namespace/name`` as asked for ("" when none was read)."""
    found: bool
    """Whether the ConfigMap was there and read."""
    note: str = ""
    """Why the defaults were used, when they were."""


def parse_location(text: str) -> tuple[str, str]:
    """``namespace/name`` → its two parts; ``ValueError`` names the expected form."""
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError(f"expected NAMESPACE/NAME (e.g. {CONFIG_MAP}), got {text!r}")
    return namespace, name


def read_cluster_settings(core_v1: Any, location: str = CONFIG_MAP) -> ConfigSource:
    """The settings of ConfigMap ``location`` (``namespace/name``; "" reads none) through the
    official client's ``CoreV1Api``."""
    if not location:
        return ConfigSource(ClusterSettings(), "", found=False, note="no ConfigMap asked for")
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    namespace, name = parse_location(location)
    try:
        config_map = core_v1.read_namespaced_config_map(name, namespace, _request_timeout=READ_TIMEOUT_S)
    except ApiException as exc:
        if exc.status == 404:
            return ConfigSource(ClusterSettings(), location, found=False,
                                note=f"no ConfigMap {location}: the built-in defaults")
        if exc.status == 403:
            log.warning("not allowed to read ConfigMap %s (get on configmaps): running with the built-in "
                        "defaults and flags; nodes whose agents run with other values are refused", location)
            return ConfigSource(ClusterSettings(), location, found=False,
                                note=f"not allowed to read ConfigMap {location}: the built-in defaults")
        raise ClusterConfigError(f"cannot read ConfigMap {location}: {exc.status} {exc.reason}") from None
    except (HTTPError, OSError) as exc:
        raise ClusterConfigError(f"cannot reach the API server to read ConfigMap {location}: {exc}") from None
    try:
        settings = from_config_data(_data(config_map), f"ConfigMap {location}")
    except ClusterSettingsError as exc:
        raise ClusterConfigError(str(exc)) from None
    return ConfigSource(settings, location, found=True)


def _data(config_map: Any) -> dict[str, Any]:
    """``data`` of a ConfigMap as the client's model or as a plain dict."""
    data = config_map.get("data") if isinstance(config_map, dict) else getattr(config_map, "data", None)
    return dict(data or {})
