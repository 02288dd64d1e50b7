"""The shared settings' flags on ``gpupool extender`` and ``gpupool node-agent``, spelt and resolved alike.

The node agent has a flag for each setting it reads (:data:`AGENT_SETTINGS`); the extender also for
its rules (``--policy``, ``--require-agent-lease``, ``--unconfirmed-timeout``), which live in the
same ConfigMap so that ``kubectl gpupool`` applies the rules the extender runs with.

Each flag overrides the cluster's ConfigMap (docs/cluster-config.md); unset, the ConfigMap's value
is used, and without the ConfigMap the built-in default, which is the value the flag's help shows.
Old spellings (``--domain``; the node agent's ``--lease-namespace``) still work, hidden, with a
warning: a DaemonSet written for an older release keeps running while its admin renames them.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from gpupool.api.cluster_settings import (
    AGENT_SETTINGS,
    CONFIG_MAP,
    DEFAULT_UNCONFIRMED_TIMEOUT_S,
    EXTENDER_RULES,
    ClusterSettings,
    ClusterSettingsError,
    Setting,
)
from gpupool.api.cluster_settings import Value as SettingValue
from gpupool.api.names import GPUSHARE_UNITS
from gpupool.cli.old_flags import old_spelling
from gpupool.core.policies import POLICIES

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
Value = SettingValue | None
_DEFAULTS = ClusterSettings()

_OVERRIDE_HARM = {
    Setting.POLICY: "kubectl gpupool why explains with the ConfigMap's value",
    Setting.REQUIRE_AGENT_LEASE: "kubectl gpupool why explains with the ConfigMap's value",
    Setting.UNCONFIRMED_TIMEOUT: "kubectl gpupool inspect and why count unbound assignments by the ConfigMap's "
                                 "value, and an extender replica without this flag books them otherwise once it leads",
}
"""What a flag that differs from the ConfigMap costs, per extender rule (the agents' settings: the
extender refuses the nodes whose agents differ)."""


@dataclass(frozen=True)
class ClusterFlags:
    """What the command line said about the shared settings: where the ConfigMap is and the
    settings given as flags (``None``: not given)."""

    config_map: str = CONFIG_MAP
    overrides: dict[Setting, Value] = field(default_factory=dict)
    """One entry per setting the component has a flag for (the settings it reads)."""

    def reads(self) -> tuple[Setting, ...]:
        """The settings the component reads: those it has flags for, else every one."""
        return tuple(s for s in Setting if s in self.overrides) or tuple(Setting)

    def given(self) -> dict[Setting, SettingValue]:
        """The overrides actually given."""
        return {s: v for s, v in self.overrides.items() if v is not None}

    def resolve(self, read: Callable[[str], ClusterSettings]) -> ClusterSettings:
        """The settings to run with: the ConfigMap's (``read``; skipped when every setting is given
        or no ConfigMap is named), each given flag on top. A bad value is a usage error."""
        try:
            everything = set(self.reads()) <= set(self.given())
            base = _DEFAULTS if everything or not self.config_map else read(self.config_map)
            settings = base.overridden(self.overrides)
        except ClusterSettingsError as exc:
            raise click.UsageError(str(exc)) from None
        for setting, value in self.given().items():
            if self.config_map and not everything and value != base.value(setting):
                harm = _OVERRIDE_HARM.get(setting, "a node agent and an extender that differ share no GPU pods")
                log.warning("%s %s overrides the cluster's %s %s (ConfigMap %s): %s (docs/cluster-config.md)",
                            setting.flag, value, setting.value, base.value(setting),
                            self.config_map, harm)
        return settings


def cluster_setting_options(*, old_lease_namespace: bool, extender_rules: bool = False) -> Callable[[F], F]:
    """Add ``--cluster-config`` and one flag per shared setting; the command receives them as one
    ``cluster_flags`` argument (:class:`ClusterFlags`). The old ``--domain`` is accepted for
    ``--resource-domain``; with ``old_lease_namespace`` the node agent's former ``--lease-namespace``
    for ``--agent-lease-namespace`` too. With ``extender_rules`` (the extender) the flags of its
    rules, ``--policy``, ``--require-agent-lease`` and ``--unconfirmed-timeout``, as well."""
    def decorate(command: F) -> F:
        @functools.wraps(command)
        def with_settings(*args: Any, cluster_config: str, resource_domain: str | None,
                          gpushare_memory_unit: str | None, high_priority_threshold: int | None, hami: bool | None,
                          agent_lease_namespace: str | None, **kwargs: Any) -> Any:
            overrides: dict[Setting, Value] = {
                Setting.RESOURCE_DOMAIN: resource_domain,
                Setting.GPUSHARE_MEMORY_UNIT: gpushare_memory_unit,
                Setting.HIGH_PRIORITY_THRESHOLD: high_priority_threshold,
                Setting.HAMI: hami,
                Setting.AGENT_LEASE_NAMESPACE: agent_lease_namespace,
            }
            assert tuple(overrides) == AGENT_SETTINGS
            if extender_rules:
                for setting in EXTENDER_RULES:
                    overrides[setting] = kwargs.pop(setting.attribute)
            return command(*args, cluster_flags=ClusterFlags(cluster_config, overrides), **kwargs)

        unset = "[default: the ConfigMap's, else {}]"
        options = [
            click.option("--cluster-config", default=CONFIG_MAP, show_default=True, metavar="NAMESPACE/NAME",
                         help="The ConfigMap holding the settings the extender, the node agents and kubectl gpupool "
                              "share (docs/cluster-config.md); \"\": read none, use flags and defaults."),
            click.option("--resource-domain", default=None,
                         help="Domain of resource and annotation names " + unset.format(_DEFAULTS.resource_domain)),
            click.option("--gpushare-memory-unit", default=None, type=click.Choice(list(GPUSHARE_UNITS)),
                         help="What one aliyun.com/gpu-mem is (gpushare clusters that ran --memory-unit=MiB) "
                              + unset.format(_DEFAULTS.gpushare_memory_unit)),
            click.option("--high-priority-threshold", default=None, type=int,
                         help="spec.priority from which a pod is high priority: never a borrower, and a lent "
                              "card's owner back for it " + unset.format(_DEFAULTS.high_priority_threshold)),
            click.option("--hami/--no-hami", default=None,
                         help="nvidia.com/gpu alone is HAMi's card count, scheduled by gpupool and served by its node "
                              "agents; only where no node runs NVIDIA's own device plugin (docs/hami.md) "
                              + unset.format("--no-hami")),
            click.option("--agent-lease-namespace", default=None,
                         help="Where node agents renew their heartbeat Leases gpupool-agent-<node> and the extender "
                              "watches them (\"\": none; docs/security.md) "
                              + unset.format(_DEFAULTS.agent_lease_namespace)),
        ]
        if extender_rules:
            options += [
                click.option("--policy", default=None, type=click.Choice(sorted(POLICIES)),
                             help="Placement policy for prioritize and for choosing cards "
                                  + unset.format(_DEFAULTS.policy)),
                click.option("--require-agent-lease/--no-require-agent-lease", default=None,
                             help="No GPU pods on a node without a live agent heartbeat Lease (docs/security.md) "
                                  + unset.format("--no-require-agent-lease")),
                click.option("--unconfirmed-timeout", default=None,
                             type=click.FloatRange(min=0, min_open=True, max=math.inf, max_open=True),
                             help="Seconds an assignment whose pod was never bound (nor confirmed by its node agent) "
                                  "holds its cards " + unset.format(f"{DEFAULT_UNCONFIRMED_TIMEOUT_S:g}")),
            ]
        decorated: Any = with_settings
        for option in reversed(options):
            decorated = option(decorated)
        decorated = old_spelling("--domain", "--resource-domain", "resource_domain")(decorated)
        if old_lease_namespace:
            decorated = old_spelling("--lease-namespace", "--agent-lease-namespace", "agent_lease_namespace")(decorated)
        return decorated  # type: ignore[no-any-return]
    return decorate


def read_with_client(kubeconfig: str | None) -> Callable[[str], ClusterSettings]:
    """The ConfigMap reader the commands use: the official client, configured as the component's
    other clients are; failures to read are usage-level errors with the reason."""
    def read(location: str) -> ClusterSettings:
        from kubernetes import client
        from kubernetes.config import ConfigException

        from gpupool.kube.client_config import api_configuration
        from gpupool.kube.cluster_config import ClusterConfigError, read_cluster_settings

        try:
            configuration = api_configuration(kubeconfig)
        except ConfigException as exc:
            raise click.ClickException(f"cannot load a kubeconfig to read ConfigMap {location}: {exc} "
                                       "(--cluster-config \"\" runs on flags and built-in defaults alone)") from None
        try:
            source = read_cluster_settings(client.CoreV1Api(client.ApiClient(configuration)), location)
        except (ClusterConfigError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
        log.info("cluster settings from %s", f"ConfigMap {location}" if source.found else source.note)
        return source.settings
    return read


def describe(settings: ClusterSettings, flags: ClusterFlags) -> str:
    """One log line: the values run with, and which came from flags."""
    given = flags.given()
    return ", ".join(f"{s.value}={settings.value(s)}{' (flag)' if s in given else ''}" for s in flags.reads())
