"""Everything one node agent is started with, in one frozen object.

``gpupool node-agent`` parses its flags into an :class:`AgentOptions` and hands it to
:func:`gpupool.nodeagent.assembly.run_agent`; tests and benchmarks build the same object. The
defaults are the shipped command's (the command reads its flag defaults from here, and a test holds
the two together), so ``AgentOptions(node)`` is the agent users run, not a test variant.

Settings the cluster shares (resource domain, HAMi names, the lease namespace, the high-priority
threshold) are read from :attr:`AgentOptions.cluster`, never given twice: the resource names, the
served aliases and the heartbeat are derived from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpupool.api.agent_lease import DEFAULT_LEASE_DURATION_S, DEFAULT_RENEW_INTERVAL_S
from gpupool.api.cluster_settings import ClusterSettings
from gpupool.api.names import ResourceNames, alias_family_resources
from gpupool.netguard.limits import ServerLimits
from gpupool.nodeagent.deviceplugin.api import DEVICE_PLUGIN_DIR, POD_RESOURCES_SOCKET
from gpupool.nodeagent.heartbeat import HeartbeatSettings
from gpupool.nodeagent.isolation.setup import IsolationConfig
from gpupool.nodeagent.metrics import DEFAULT_METRICS_PORT
from gpupool.nodeagent.monitor.service import MonitorConfig
from gpupool.nodeagent.risk.backstop import DEFAULT_OVERHEAD_MIB
from gpupool.nodeagent.risk.detector import DEFAULT_GRACE_S
from gpupool.nodeagent.risk.findings import RiskAction

if TYPE_CHECKING:
    from gpupool.nodeagent.dra.setup import DraOptions
    from gpupool.nodeagent.driver_libraries import DriverLibraries
    from gpupool.nodeagent.lending.options import LendingOptions
    from gpupool.nodeagent.remote_setup import RemoteGpuOptions
    from gpupool.nodeagent.selfcheck import Check

HAMI_FAMILY = "hami"
"""The alias family HAMi's names form (served when the cluster's ``hami`` setting is on)."""


class AgentOptionsError(ValueError):
    """Options that cannot run together, or a part that cannot be built from them; ``option`` names
    the command-line flag to blame (None: no single flag)."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class RiskOptions:
    """``--risk-action``, ``--risk-grace`` and ``--risk-memory-tolerance`` (docs/security.md)."""

    action: RiskAction = RiskAction.REPORT
    grace_s: float = DEFAULT_GRACE_S
    memory_tolerance_mib: int = DEFAULT_OVERHEAD_MIB


@dataclass(frozen=True)
class AgentOptions:
    """One node agent's configuration; each optional feature is ``None`` when off."""

    node: str
    """This node's name in Kubernetes."""
    fake_gpus: str | None = None
    """A YAML file describing the GPUs instead of NVML (docs/node-agent.md)."""
    plugin_dir: str = DEVICE_PLUGIN_DIR
    pod_resources_socket: str = POD_RESOURCES_SOCKET
    kubeconfig: str | None = None
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    """The settings the extender and the kubectl plugin must read alike (docs/cluster-config.md)."""
    alias_families: tuple[str, ...] = ()
    """Foreign resource families served besides gpupool's (``--serve-aliases``; HAMi's come from
    :attr:`cluster`)."""
    metrics_port: int = DEFAULT_METRICS_PORT
    """0: no metrics server."""
    monitor: MonitorConfig | None = field(default_factory=MonitorConfig)
    isolation: IsolationConfig = field(default_factory=IsolationConfig)
    lease_duration_s: int = DEFAULT_LEASE_DURATION_S
    lease_renew_interval_s: float = DEFAULT_RENEW_INTERVAL_S
    risk: RiskOptions = field(default_factory=RiskOptions)
    lending: LendingOptions | None = None
    dra: DraOptions | None = None
    remote: RemoteGpuOptions | None = None
    server_limits: ServerLimits = field(default_factory=ServerLimits)
    libraries: DriverLibraries | None = None
    """The NVIDIA driver's libraries every grant mounts (plain runc), or none."""
    start_checks: Sequence[Check] = ()
    """The start-up checks' verdicts, summarised on the Node (``kubectl gpupool``)."""

    def __post_init__(self) -> None:
        if self.lending is not None and self.monitor is None:
            raise AgentOptionsError("lending needs the usage monitor (drop --no-usage-monitor)", "--lending")
        if self.dra is not None and self.risk.action is not RiskAction.REPORT:
            raise AgentOptionsError(
                f"{self.risk.action.value} cannot be combined with --dra yet: the risk checks grant a DRA container "
                "its claims' shares, but acting on their findings is not exercised with claims end to end "
                "(docs/dra.md); use --risk-action=report", "--risk-action")
        if HAMI_FAMILY in self.alias_families:
            raise AgentOptionsError("HAMi's names are the cluster's hami setting, not an alias family",
                                    "--serve-aliases")
        try:
            alias_family_resources(list(self.alias_families))
        except ValueError as exc:
            raise AgentOptionsError(str(exc), "--serve-aliases") from None

    @property
    def names(self) -> ResourceNames:
        """The names pods and this Node are read and written with."""
        return self.cluster.resource_names()

    @property
    def aliases(self) -> tuple[str, ...]:
        """The foreign resources served: the asked-for families', then HAMi's where the cluster says so."""
        aliases = tuple(alias_family_resources(list(self.alias_families)))
        if self.cluster.hami:
            aliases += tuple(a for a in alias_family_resources([HAMI_FAMILY]) if a not in aliases)
        return aliases

    @property
    def heartbeat(self) -> HeartbeatSettings | None:
        """The Lease this agent renews, in the cluster's lease namespace; None where that is empty."""
        namespace = self.cluster.agent_lease_namespace
        if not namespace:
            return None
        return HeartbeatSettings(namespace, self.lease_duration_s, self.lease_renew_interval_s)
