"""Build the risk checks from ``gpupool node-agent``'s options (``--risk-action``, ``--risk-grace``,
``--risk-memory-tolerance``, and ``--state-dir`` where the interception library keeps its regions)."""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.containers.container_gate import ContainerGate
from gpupool.nodeagent.monitor.container_resolver import ContainerResolver
from gpupool.nodeagent.monitor.service import UsageMonitor
from gpupool.nodeagent.risk.backstop import DEFAULT_OVERHEAD_MIB
from gpupool.nodeagent.risk.decider import RiskOpenDecider
from gpupool.nodeagent.risk.findings import RiskAction
from gpupool.nodeagent.risk.regions import RegionReader
from gpupool.nodeagent.risk.responder import PostWarning, RiskResponder
from gpupool.nodeagent.risk.service import RiskMonitor

ACTIONS = tuple(action.value for action in RiskAction)


RISK_GATE_DECIDER = "risk"
"""The risk checks' name among the device gate's deciders."""


def gate_blocked(decider: RiskOpenDecider, gate: ContainerGate, cards: Iterable[str]) -> None:
    """Let the kernel's gate refuse the blocked containers' opens of the card files (``cards``; the
    control devices stay open: a container's tools keep working, and without a card no GPU is used)."""
    paths = tuple(cards)
    decider.use_gate(lambda blocked: gate.set(RISK_GATE_DECIDER, {cid: paths for cid in blocked}))


def can_refuse_opens(decider: RiskOpenDecider | None, monitor: UsageMonitor) -> bool:
    """Whether ``refuse-opens`` is enforced: the kernel's gate has the blocked set, or the event source
    holds every open for the decider's verdict (fanotify)."""
    if decider is None:
        return False
    return decider.gated or (monitor.source is not None and monitor.source.can_decide)


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
                              can_refuse=lambda: can_refuse_opens(decider, monitor),
                              evict=evict, cordon=agent.cordon if action is RiskAction.CORDON_CARD else None)
    regions = RegionReader(shim_state_dir) if shim_state_dir else None
    return RiskMonitor(agent, monitor, responder, decider=decider, grace_s=grace_s, overhead_mib=overhead_mib,
                       regions=regions)
