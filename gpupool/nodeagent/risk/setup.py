"""Build the risk checks from ``gpupool node-agent``'s options (``--risk-action``, ``--risk-grace``,
``--risk-memory-tolerance``, and ``--state-dir`` where the interception library keeps its regions)."""

from __future__ import annotations

from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.monitor.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.monitor.container_resolver import ContainerResolver
from gpupool.nodeagent.monitor.service import UsageMonitor
from gpupool.nodeagent.risk.backstop import DEFAULT_OVERHEAD_MIB
from gpupool.nodeagent.risk.decider import RiskOpenDecider
from gpupool.nodeagent.risk.findings import RiskAction
from gpupool.nodeagent.risk.regions import RegionReader
from gpupool.nodeagent.risk.responder import PostWarning, RiskResponder
from gpupool.nodeagent.risk.service import RiskMonitor

ACTIONS = tuple(action.value for action in RiskAction)


def open_decider(action: RiskAction) -> RiskOpenDecider | None:
    """The decider to chain into the usage monitor's source; only ``refuse-opens`` needs one."""
    if action is not RiskAction.REFUSE_OPENS:
        return None
    return RiskOpenDecider(ContainerResolver(InMemoryContainerDirectory()).cgroup_identity)


def build_risk(action: RiskAction, agent: NodeAgent, monitor: UsageMonitor, post: PostWarning,
               decider: RiskOpenDecider | None, kubeconfig: str | None, grace_s: float,
               overhead_mib: int = DEFAULT_OVERHEAD_MIB, shim_state_dir: str | None = None) -> RiskMonitor:
    """The checks on ``agent``'s view through ``monitor``, acting by ``action``; the library's regions
    under ``shim_state_dir`` are compared with the driver's figures where the library enforces."""
    evict = None
    if action is RiskAction.EVICT:
        from gpupool.nodeagent.risk.eviction import kube_evictor
        evict = kube_evictor(agent.node, kubeconfig)
    responder = RiskResponder(action, post, decider=decider,
                              can_refuse=lambda: monitor.source is not None and monitor.source.can_decide,
                              evict=evict, cordon=agent.cordon if action is RiskAction.CORDON_CARD else None)
    regions = RegionReader(shim_state_dir) if shim_state_dir else None
    return RiskMonitor(agent, monitor, responder, decider=decider, grace_s=grace_s, overhead_mib=overhead_mib,
                       regions=regions)
