"""The node agent composed from its :class:`~gpupool.nodeagent.options.AgentOptions`.

:func:`build_agent` makes the parts in the order they need each other and returns them, not
started: the GPU backend, the pod source (the one place pod events are fed to the other parts), the
usage monitor, the enforcement backend (isolation, driver libraries, the checkpoint protocol), the
refusal at open, the lending part, the DRA driver, then the agent with its collaborators in its
constructor, the device plugins and the risk checks. :func:`run_agent` runs them until cancelled.
``gpupool node-agent`` only turns flags into options and calls :func:`run_agent`; an option that
cannot be honoured raises :class:`~gpupool.nodeagent.options.AgentOptionsError` naming its flag.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpupool.nodeagent.agent_link import AgentLink
from gpupool.nodeagent.options import AgentOptions, AgentOptionsError

if TYPE_CHECKING:
    from gpupool.nodeagent.agent import NodeAgent
    from gpupool.nodeagent.containers.container_gate import ContainerGate
    from gpupool.nodeagent.deviceplugin.manager import DevicePluginManager
    from gpupool.nodeagent.dra.setup import DraDriver
    from gpupool.nodeagent.gpu_inventory import GpuBackend
    from gpupool.nodeagent.isolation.backends import Enforcement
    from gpupool.nodeagent.kube_pod_source import KubePodSource
    from gpupool.nodeagent.lending.setup import LoanedCapacity
    from gpupool.nodeagent.monitor.service import UsageMonitor
    from gpupool.nodeagent.risk.decider import RiskOpenDecider
    from gpupool.nodeagent.risk.service import RiskMonitor

log = logging.getLogger(__name__)


@dataclass
class AgentParts:
    """One node agent's parts, built; each optional one is ``None`` when its feature is off."""

    options: AgentOptions
    backend: GpuBackend
    pods: KubePodSource
    """This node's pods from the API server; its cache feeds the monitor's directory and lending."""
    monitor: UsageMonitor | None
    gate: ContainerGate | None
    """The kernel's refusal at open, where the monitor found it usable."""
    enforcement: Enforcement
    lending: LoanedCapacity | None
    dra: DraDriver | None
    agent: NodeAgent
    manager: DevicePluginManager
    risk: RiskMonitor | None

    def close(self) -> None:
        """Stop what runs beside the event loop (the monitor's threads, the gate's programs, NVML)."""
        if self.monitor is not None:
            self.monitor.stop()
        if self.gate is not None:
            self.gate.close()
        self.backend.close()

    async def run(self) -> None:
        """Serve until cancelled: the pod watch first, the device plugins, the agent, the Node's
        inventory and annotations, and each feature that is on."""
        from gpupool.nodeagent.metrics import serve_metrics
        from gpupool.nodeagent.risk.metrics import RiskCollector

        options, agent, pods = self.options, self.agent, self.pods
        if self.lending is not None:
            self.lending.start()
        extra = [RiskCollector(self.risk)] if self.risk is not None else []
        remote = options.remote
        metrics = (await serve_metrics(agent, options.metrics_port, extra=extra, limits=options.server_limits,
                                       remote_clients=remote.clients_file if remote is not None else None)
                   if options.metrics_port else None)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(pods.run())  # the watch of this node's pods, first
                group.create_task(self.manager.run())
                group.create_task(agent.run())
                group.create_task(self._publish_once_served())
                started_with = start_annotations(options)
                if started_with:  # on the Node for the extender (settings) and `kubectl describe node` (checks)
                    from gpupool.nodeagent.start_annotations import kube_core_v1, publish_annotations
                    group.create_task(publish_annotations(kube_core_v1(options.node, options.kubeconfig),
                                                          options.node, started_with))
                if self.dra is not None:
                    group.create_task(self.dra.run(agent.wait_devices_changed, agent.devices_version))
                if self.risk is not None:
                    group.create_task(self.risk.run())
                if self.lending is not None:
                    group.create_task(self.lending.run())  # its loop and the checkpoint retention sweep
                if remote is not None:  # remote shares booked on this node's cards (docs/remote-gpu.md)
                    from gpupool.nodeagent.remote_setup import run_remote_gpu
                    from gpupool.nodeagent.start_annotations import kube_core_v1 as core_v1_of
                    group.create_task(run_remote_gpu(options.node, options.names, remote,
                                                     core_v1_of(options.node, options.kubeconfig)))
                heartbeat = options.heartbeat
                if heartbeat is not None:  # only while registered: a live Lease means a served node
                    from gpupool.nodeagent.heartbeat import kube_heartbeat
                    group.create_task(kube_heartbeat(options.node, options.kubeconfig, heartbeat)
                                      .run(served=self.manager.registered))
        finally:
            if metrics is not None:
                await metrics.cleanup()

    async def _publish_once_served(self) -> None:
        """The inventory goes on the Node only once kubelet accepted the device plugins (the
        extender places pods by it; kubelet must be able to grant them), then on every change."""
        from gpupool.nodeagent.foreign_capacity import foreign_capacity
        from gpupool.nodeagent.isolation.backends import enforcement_notice

        agent, choice = self.agent, self.options.isolation.choice()
        await self.manager.registered.wait()
        version = agent.devices_version
        while True:
            await self.pods.publish_node(agent.node, agent.inventory, enforcement_notice(choice, agent.enforcement),
                                         foreign_capacity(agent.resources, len(agent.inventory.cards)))
            version = await agent.wait_devices_changed(version)


async def run_agent(options: AgentOptions) -> None:
    """Build the agent from ``options`` and serve until cancelled, then stop its parts."""
    parts = await build_agent(options)
    try:
        await parts.run()
    finally:
        parts.close()


async def build_agent(options: AgentOptions) -> AgentParts:
    """The parts of the agent ``options`` describe, not yet serving (the usage monitor is started: its
    probe decides whether the refusal at open can run). Raises :class:`AgentOptionsError`."""
    from gpupool.nodeagent.kube_pod_source import KubePodSource
    from gpupool.nodeagent.risk.setup import open_decider

    backend = _gpu_backend(options)
    monitor = None
    try:
        pods = KubePodSource(options.names, options.node, options.kubeconfig)
        decider = open_decider(options.risk.action)
        monitor = _start_monitor(options, backend, pods, decider)
        return _compose(options, backend, pods, monitor, decider)
    except BaseException:
        if monitor is not None:
            monitor.stop()
        backend.close()
        raise


def _compose(options: AgentOptions, backend: GpuBackend, pods: KubePodSource, monitor: UsageMonitor | None,
             decider: RiskOpenDecider | None) -> AgentParts:
    from gpupool.nodeagent.agent import NodeAgent
    from gpupool.nodeagent.allocated_codec import encode_served
    from gpupool.nodeagent.device_layout import list_and_watch_problem
    from gpupool.nodeagent.deviceplugin.manager import DevicePluginManager
    from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
    from gpupool.nodeagent.schedule_check import REFUSED_REASON

    node, names = options.node, options.names
    enforcement = _enforcement(options, backend, pods, monitor)
    link = AgentLink()
    lending = None
    gate = _device_gate(monitor, decider)
    try:
        if options.lending is not None and monitor is not None:
            from gpupool.nodeagent.lending.setup import LendingSetup
            setup = LendingSetup(node, names, options.lending, options.kubeconfig)
            pods.cache.feeds.append(setup.pods)
            enforcement = setup.wrap(enforcement)
            lending = setup.build(node, monitor, link.inventory, link.listed_pods, link.devices_changed, gate)
        dra = _dra_driver(options, enforcement, link) if options.dra is not None else None
        if lending is not None and dra is not None:  # a claim's containers are booked on its cards
            lending.use_claims(dra.state.as_pods)

        async def report_refusal(pod: tuple[str, str], reason: str) -> None:
            await pods.post_event(*pod, REFUSED_REASON, reason, event_type="Warning")

        agent = NodeAgent(node, names, backend, pods, PodResourcesClient(options.pod_resources_socket), encode_served,
                          aliases=options.aliases, monitor=monitor, enforcement=enforcement,
                          report_refusal=report_refusal, shares=options.isolation.choice().shares, lent=lending,
                          claims_granted=dra.state.as_pods if dra is not None else None)
        link.join(agent)
        for resource in agent.resources:  # a list kubelet cannot read would leave the resource unserved
            problem = list_and_watch_problem(agent.layout, resource, agent.inventory)
            if problem is not None:
                raise AgentOptionsError(problem)
        manager = DevicePluginManager(options.plugin_dir, agent.resources, agent, own_domain=names.domain)
        return AgentParts(options, backend, pods, monitor, gate, enforcement, lending, dra, agent, manager,
                          _risk_checks(options, agent, pods, monitor, decider))
    except BaseException:
        if gate is not None:
            gate.close()
        raise


def _gpu_backend(options: AgentOptions) -> GpuBackend:
    """NVML, or the cards of ``--fake-gpus`` (a file it cannot read: the file and field named)."""
    if options.fake_gpus:
        from gpupool.nodeagent.nvml.fake import FakeGpuBackend, FakeGpuFileError
        try:
            return FakeGpuBackend.from_file(options.fake_gpus)
        except FakeGpuFileError as exc:
            raise AgentOptionsError(str(exc), "--fake-gpus") from None
    from gpupool.nodeagent.nvml.real import NvmlBackend
    return NvmlBackend()


def _start_monitor(options: AgentOptions, backend: GpuBackend, pods: KubePodSource,
                   decider: RiskOpenDecider | None) -> UsageMonitor | None:
    """The usage monitor, started, with the pod cache feeding its container directory; None when off
    or when it cannot start (the device plugin is what the node's pods need: the agent runs without)."""
    from gpupool.nodeagent.containers.pod_containers import DirectoryFeed
    from gpupool.nodeagent.usage_monitor import build_monitor, pod_event_listener

    config = options.monitor
    if config is None:
        return None
    monitor = build_monitor(options.node, backend, config, pod_event_listener(pods.post_event, config.idle_after),
                            **({"decide": decider} if decider is not None else {}))
    pods.cache.feeds.append(DirectoryFeed(monitor.directory))
    try:
        monitor.start()  # logs which event source runs and why
    except Exception:
        log.exception("usage monitor not started; the agent runs without it")
        monitor.stop()
        return None
    return monitor


def _enforcement(options: AgentOptions, backend: GpuBackend, pods: KubePodSource,
                 monitor: UsageMonitor | None) -> Enforcement:
    """The isolation backend on the containers the monitor (or, without it, the pod cache alone)
    knows, with the driver's libraries in every grant where asked."""
    from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
    from gpupool.nodeagent.containers.pod_containers import DirectoryFeed
    from gpupool.nodeagent.driver_libraries import DriverLibrariesEnforcement
    from gpupool.nodeagent.isolation.backends import IsolationConfigError
    from gpupool.nodeagent.isolation.setup import build_enforcement

    directory = monitor.directory if monitor is not None else InMemoryContainerDirectory()
    if monitor is None:
        pods.cache.feeds.append(DirectoryFeed(directory))
    try:
        cards = backend.inventory()
        enforcement = build_enforcement(options.isolation, directory,
                                        {c.index: cards.pci_bus_id(c.index) for c in cards.cards})
    except (IsolationConfigError, OSError) as exc:
        raise AgentOptionsError(str(exc), "--isolation") from None
    libraries = options.libraries
    if libraries is not None:  # plain runc: the grant carries the driver (docs/node-agent.md)
        log.info("driver libraries for every grant from %s: %s", libraries.source, ", ".join(sorted(libraries.files)))
        enforcement = DriverLibrariesEnforcement(enforcement, libraries)
    return enforcement


def _device_gate(monitor: UsageMonitor | None, decider: RiskOpenDecider | None) -> ContainerGate | None:
    """The kernel's refusal at open (cgroup-device programs) where the monitor's probe found it usable:
    the lending rules and ``refuse-opens`` precompute their refusals into it."""
    if monitor is None or not monitor.gate_available:
        return None
    from gpupool.nodeagent.containers.container_gate import open_container_gate
    from gpupool.nodeagent.risk.setup import gate_blocked
    gate, why = open_container_gate()
    if gate is None:
        log.warning("device gate not started (%s): refusals only by reclaim", why)
        return None
    if decider is not None:
        gate_blocked(decider, gate, monitor.cards)
    return gate


def _dra_driver(options: AgentOptions, enforcement: Enforcement, link: AgentLink) -> DraDriver:
    """The DRA driver on the agent's cards and enforcement; a checkpoint it cannot read stops the
    agent with the file named and what to do (docs/dra.md)."""
    from gpupool.nodeagent.dra.checkpoint import CheckpointError
    from gpupool.nodeagent.dra.kube_client import KubeDraClient
    from gpupool.nodeagent.dra.plugin_holdings import plugin_pods
    from gpupool.nodeagent.dra.setup import DraDriver

    assert options.dra is not None
    node = options.node
    client = KubeDraClient(node, options.kubeconfig)
    try:
        return DraDriver(node, options.names.domain, options.dra, link.inventory, client.read_claim, client,
                         enforcement, held_elsewhere=lambda: plugin_pods(node, link.listed_pods()))
    except CheckpointError as exc:
        raise AgentOptionsError(str(exc)) from None


def _risk_checks(options: AgentOptions, agent: NodeAgent, pods: KubePodSource, monitor: UsageMonitor | None,
                 decider: RiskOpenDecider | None) -> RiskMonitor | None:
    """The risk checks on the monitor's holders (none without the monitor)."""
    from gpupool.nodeagent.risk.setup import build_risk

    if monitor is None:
        log.warning("risk checks off: they need the usage monitor's holders")
        return None

    async def post_warning(namespace: str, pod: str, reason: str, message: str) -> None:
        await pods.post_event(namespace, pod, reason, message, event_type="Warning")

    risk = options.risk
    return build_risk(risk.action, agent, monitor, post_warning, decider, options.kubeconfig, risk.grace_s,
                      risk.memory_tolerance_mib, options.isolation.state_dir)


def start_annotations(options: AgentOptions) -> dict[str, str]:
    """What the agent leaves on its Node at start, written in one patch: the cluster settings the
    extender checks it against (docs/cluster-config.md) and the start-up checks' summary."""
    from datetime import UTC, datetime

    from gpupool.api.cluster_settings import AGENT_CHECKS_ANNOTATION, AGENT_SETTINGS_ANNOTATION
    from gpupool.nodeagent.selfcheck import checks_annotation

    annotations = {AGENT_SETTINGS_ANNOTATION: options.cluster.published()}
    if options.start_checks:
        annotations[AGENT_CHECKS_ANNOTATION] = checks_annotation(options.start_checks, datetime.now(UTC))
    return annotations
