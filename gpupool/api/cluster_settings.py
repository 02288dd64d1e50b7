"""The settings the extender, every node agent and the kubectl plugin must share, defined once.

Five values decide how a pod object is read and where a node's agent can be seen; when two
components read them differently, pods are booked wrong (a gpushare unit off by 1024), refused for
no visible reason, or borrowed by a pod the node calls high priority. Three more are the extender's
rules, which ``kubectl gpupool`` must apply to explain the decisions the extender makes and show
what it books: the placement policy, whether a node without an agent Lease is refused, and how long
an assignment whose pod was never bound holds its cards (the unconfirmed timeout). They live in
one place, the ConfigMap ``gpupool-system/gpupool-cluster`` (:data:`CONFIG_MAP`), read by all three
at start; each component's flag of the same name overrides it (docs/cluster-config.md).

Why a ConfigMap rather than a custom resource: it needs no CRD installed before the components can
start, a chart or kustomize overlay sets it with a literal, ``kubectl edit`` changes it, and RBAC can
grant ``get`` on exactly this one object by name. A cluster-scoped CR would add a CRD and a
ClusterRole for eight strings.

Every node agent publishes the values it reads pods with on its Node (:data:`AGENT_SETTINGS_ANNOTATION`,
read by :mod:`gpupool.api.settings_check`; the extender's rules are not among them: no agent applies
them, so an agent cannot differ on them), so a component started with other values, by an
override or before the ConfigMap changed, is caught rather than trusted.

The defaults here are the shipped command-line defaults: a library user and a test get what a
cluster without the ConfigMap runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeAlias

from gpupool.api.agent_lease import DEFAULT_LEASE_NAMESPACE
from gpupool.api.lending import DEFAULT_HIGH_PRIORITY_THRESHOLD
from gpupool.api.names import DEFAULT_DOMAIN, GPUSHARE_UNITS, ResourceNames
from gpupool.core.policies import DEFAULT_POLICY, POLICIES

CONFIG_MAP_NAMESPACE = "gpupool-system"
CONFIG_MAP_NAME = "gpupool-cluster"
CONFIG_MAP = f"{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}"
"""Where the components look unless ``--cluster-config`` says otherwise."""

AGENT_SETTINGS_ANNOTATION = "gpupool.io/agent-settings-v1"
"""Node annotation: the settings the node's agent runs with (JSON). Its key never follows the
resource domain, since a domain that differs is one of the things it must reveal."""

AGENT_CHECKS_ANNOTATION = "gpupool.io/agent-checks"
"""Node annotation: the summary of the agent's start-up checks (``gpupool.nodeagent.selfcheck``),
written beside its settings and read by ``kubectl gpupool``; fixed, as the settings' key is."""

DEFAULT_UNCONFIRMED_TIMEOUT_S = 300.0
"""How long an assignment whose pod was never bound holds its cards, by default (seconds)."""

Value: TypeAlias = str | int | float | bool
"""One setting's value: a name, the threshold (int), the unconfirmed timeout (float), a switch."""

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_BOOLEANS = {"true": True, "false": False}


class ClusterSettingsError(ValueError):
    """A setting that cannot be read; the message names the key, the value and where it came from."""


class Setting(StrEnum):
    """The shared settings, by their key in the ConfigMap and in the node annotation."""

    RESOURCE_DOMAIN = "resourceDomain"
    GPUSHARE_MEMORY_UNIT = "gpushareMemoryUnit"
    HIGH_PRIORITY_THRESHOLD = "highPriorityThreshold"
    HAMI = "hami"
    AGENT_LEASE_NAMESPACE = "agentLeaseNamespace"
    POLICY = "policy"
    REQUIRE_AGENT_LEASE = "requireAgentLease"
    UNCONFIRMED_TIMEOUT = "unconfirmedTimeout"

    @property
    def flag(self) -> str:
        """The command-line override, spelt the same on the extender, the node agent and (for the
        resource domain and the placement rules) the kubectl plugin."""
        switches = {Setting.HAMI: "--hami/--no-hami",
                    Setting.REQUIRE_AGENT_LEASE: "--require-agent-lease/--no-require-agent-lease"}
        return switches.get(self, "--" + re.sub(r"([A-Z])", r"-\1", self.value).lower())

    @property
    def agents_read(self) -> bool:
        """Whether node agents read it, publish it and are refused when they differ. The extender's
        rules are its alone (and ``kubectl gpupool``'s, which mirrors them): an agent never places a
        pod, and sees a pod only once it is bound to its node, when the unconfirmed timeout no longer
        applies."""
        return self not in EXTENDER_RULES

    @property
    def attribute(self) -> str:
        """The :class:`ClusterSettings` field that holds it."""
        return re.sub(r"([A-Z])", r"_\1", self.value).lower()


@dataclass(frozen=True)
class ClusterSettings:
    """One value of every shared setting (validated on construction)."""

    resource_domain: str = DEFAULT_DOMAIN
    """Domain of gpupool's resource, annotation and label names."""
    gpushare_memory_unit: str = "GiB"
    """What one ``aliyun.com/gpu-mem`` is: ``GiB`` (gpushare's default) or ``MiB``."""
    high_priority_threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD
    """``spec.priority`` from which a pod is high priority: never a borrower, and a lent card's
    owner comes back for it (:func:`gpupool.api.lending.pod_priority` applies it on both sides)."""
    hami: bool = False
    """``nvidia.com/gpu`` is HAMi's card count, scheduled by gpupool and served by its node agents."""
    agent_lease_namespace: str = DEFAULT_LEASE_NAMESPACE
    """Where node agents renew their heartbeat Leases and the extender watches them ("": none)."""
    policy: str = DEFAULT_POLICY
    """The extender's placement policy (:data:`gpupool.core.policies.POLICIES`), which ``why`` applies too."""
    require_agent_lease: bool = False
    """The extender places no GPU pod on a node without a live agent Lease (``why`` says so per node)."""
    unconfirmed_timeout: float = DEFAULT_UNCONFIRMED_TIMEOUT_S
    """Seconds an assignment whose pod is neither bound nor confirmed by its node agent holds its
    cards (:func:`gpupool.kube.pod_holding.holding`): the extender books by it, ``kubectl gpupool
    inspect`` and ``why`` count what the extender counts by it, and every extender replica (a new
    leader rebuilds its bookings from the pods) must judge such a pod alike."""

    def __post_init__(self) -> None:
        try:
            self.resource_names()
        except ValueError as exc:
            raise ClusterSettingsError(str(exc)) from None
        if not isinstance(self.high_priority_threshold, int) or isinstance(self.high_priority_threshold, bool):
            raise ClusterSettingsError(f"{Setting.HIGH_PRIORITY_THRESHOLD}: expected an integer, "
                                       f"got {self.high_priority_threshold!r}")
        if self.agent_lease_namespace and not _NAMESPACE.match(self.agent_lease_namespace):
            raise ClusterSettingsError(f"{Setting.AGENT_LEASE_NAMESPACE}: {self.agent_lease_namespace!r} is not a "
                                       "namespace name (lower-case letters, digits and '-', at most 63)")
        if self.policy not in POLICIES:
            raise ClusterSettingsError(f"{Setting.POLICY}: unknown policy {self.policy!r}; the policies are "
                                       f"{', '.join(sorted(POLICIES))}")
        if not isinstance(self.require_agent_lease, bool):
            raise ClusterSettingsError(f"{Setting.REQUIRE_AGENT_LEASE}: expected true or false, "
                                       f"got {self.require_agent_lease!r}")
        timeout = self.unconfirmed_timeout
        if (not isinstance(timeout, int | float) or isinstance(timeout, bool)
                or not math.isfinite(timeout) or timeout <= 0):
            raise ClusterSettingsError(f"{Setting.UNCONFIRMED_TIMEOUT}: expected seconds above 0, got {timeout!r}")

    @classmethod
    def reading(cls, names: ResourceNames, high_priority_threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD,
                agent_lease_namespace: str = DEFAULT_LEASE_NAMESPACE) -> ClusterSettings:
        """The settings a component that reads pods with ``names`` runs with (for a caller that was
        given names rather than settings)."""
        unit = next(k for k, v in GPUSHARE_UNITS.items() if v == names.gpushare_unit_mib)
        return cls(names.domain, unit, high_priority_threshold, names.hami, agent_lease_namespace)

    def resource_names(self) -> ResourceNames:
        """The names and units pods and nodes are read with."""
        if self.gpushare_memory_unit not in GPUSHARE_UNITS:
            raise ValueError(f"{Setting.GPUSHARE_MEMORY_UNIT}: expected one of {', '.join(GPUSHARE_UNITS)}, "
                             f"got {self.gpushare_memory_unit!r}")
        return ResourceNames(self.resource_domain, hami=self.hami,
                             gpushare_unit_mib=GPUSHARE_UNITS[self.gpushare_memory_unit])

    def value(self, setting: Setting) -> Value:
        """The value of one setting."""
        value: Value = getattr(self, setting.attribute)
        return value

    def overridden(self, overrides: Mapping[Setting, Value | None]) -> ClusterSettings:
        """These settings with the given ones replaced (``None``: not given, keep this value)."""
        changes: dict[str, Any] = {s.attribute: v for s, v in overrides.items() if v is not None}
        return dataclasses.replace(self, **changes) if changes else self

    def published(self) -> str:
        """The node annotation's value: every setting agents read (:data:`AGENT_SETTINGS`), as JSON
        (keys sorted, so that an unchanged agent writes the same text and its patch changes nothing)."""
        return json.dumps({"v": 1, **{s.value: self.value(s) for s in AGENT_SETTINGS}}, sort_keys=True,
                          separators=(",", ":"))


EXTENDER_RULES = (Setting.POLICY, Setting.REQUIRE_AGENT_LEASE, Setting.UNCONFIRMED_TIMEOUT)
"""The extender's rules: read by the extender and by ``kubectl gpupool`` (which mirrors them), not
by node agents, so neither published by them nor compared."""

AGENT_SETTINGS = tuple(s for s in Setting if s.agents_read)
"""The settings a node agent reads, publishes and is compared on."""


def from_config_data(data: Mapping[str, Any] | None, where: str = CONFIG_MAP) -> ClusterSettings:
    """The settings a ConfigMap's ``data`` holds; a key it leaves out keeps its default.

    An unknown key is refused (a misspelt key would otherwise leave its setting at the default
    without a word); so is a value of the wrong kind, with the key and ``where`` named.
    """
    data = data or {}
    unknown = sorted(set(data) - {s.value for s in Setting})
    if unknown:
        raise ClusterSettingsError(f"{where}: unknown key {unknown[0]!r}; the keys are "
                                   f"{', '.join(s.value for s in Setting)}")
    values: dict[Setting, Value | None] = {}
    for setting in Setting:
        if setting.value in data:
            values[setting] = _parse(setting, str(data[setting.value]).strip(), where)
    try:
        return ClusterSettings().overridden(values)
    except ClusterSettingsError as exc:
        raise ClusterSettingsError(f"{where}: {exc}") from None


def _parse(setting: Setting, text: str, where: str) -> Value:
    if setting in (Setting.HAMI, Setting.REQUIRE_AGENT_LEASE):
        if text.lower() not in _BOOLEANS:
            raise ClusterSettingsError(f"{where}: {setting}: expected true or false, got {text!r}")
        return _BOOLEANS[text.lower()]
    if setting is Setting.HIGH_PRIORITY_THRESHOLD:
        try:
            return int(text)
        except ValueError:
            raise ClusterSettingsError(f"{where}: {setting}: expected an integer, got {text!r}") from None
    if setting is Setting.UNCONFIRMED_TIMEOUT:
        try:
            return float(text)
        except ValueError:
            raise ClusterSettingsError(f"{where}: {setting}: expected seconds (a number such as \"300\"), "
                                       f"got {text!r}") from None
    return text


def read_published(text: str, where: str) -> dict[Setting, Value]:
    """The settings a node's agent published (:meth:`ClusterSettings.published`).

    Only the agents' keys this build knows are returned (:data:`AGENT_SETTINGS`), and only those
    present: an agent of another version is compared on what both know. A value of the wrong type
    is refused.
    """
    try:
        doc = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        raise ClusterSettingsError(f"{where}: {AGENT_SETTINGS_ANNOTATION} is not valid JSON") from None
    if not isinstance(doc, dict):
        raise ClusterSettingsError(f"{where}: {AGENT_SETTINGS_ANNOTATION} is not a JSON object")
    out: dict[Setting, Value] = {}
    for setting in AGENT_SETTINGS:
        if setting.value not in doc:
            continue
        value = doc[setting.value]
        kind = type(ClusterSettings().value(setting))
        if type(value) is not kind:  # exact: a boolean is no threshold, a number no domain
            raise ClusterSettingsError(f"{where}: {AGENT_SETTINGS_ANNOTATION}.{setting}: expected "
                                       f"{kind.__name__}, got {value!r}"[:300])
        out[setting] = value
    return out
