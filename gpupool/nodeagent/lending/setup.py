"""Assembling the lending side for ``gpupool node-agent --lending``.

Two steps, because the grant's checkpoint extras must wrap the enforcement backend before the node
agent exists, and the service needs the agent's device list and monitor afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable

from gpupool.api.lending import LendableCard, LendingNames
from gpupool.api.names import ResourceNames
from gpupool.core.model import ContainerAssignment
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.isolation.backends import Enforcement
from gpupool.nodeagent.lending.checkpoint import CheckpointEnforcement, CheckpointStore, find_cuda_checkpoint
from gpupool.nodeagent.lending.checkpoint_location import describe as describe_checkpoint_location
from gpupool.nodeagent.lending.cuda_suspend import CudaCheckpoint
from gpupool.nodeagent.lending.kube_io import KubeLending
from gpupool.nodeagent.lending.options import LendingOptions
from gpupool.nodeagent.lending.pods import LendingPods
from gpupool.nodeagent.lending.processes import ProcfsProcesses
from gpupool.nodeagent.lending.publisher import LendablePublisher
from gpupool.nodeagent.lending.reclaim import Reclaimer, StoppedHook
from gpupool.nodeagent.lending.service import LendingConfig, LendingService
from gpupool.nodeagent.monitor.container_gate import ContainerGate
from gpupool.nodeagent.monitor.container_resolver import ContainerResolver
from gpupool.nodeagent.monitor.service import UsageMonitor
from gpupool.nodeagent.schedule_check import check_borrower
from gpupool.nodeagent.types import PodView

log = logging.getLogger(__name__)

LOANS_FILE = "lending.json"


Vouch = Callable[[PodView, ContainerAssignment], bool]


def borrower_check(node: str, inventory: Callable[[], GpuInventory], listed: Callable[[], list[PodView]],
                   on_loan: Callable[[PodView], bool], loans: Callable[[], Iterable[LendableCard]]) -> Vouch:
    """The agent's Allocate check of a borrower (:attr:`NodeAgent.vouch`): the core's lent rule, as the
    extender books a placement with ``borrowed_from`` (:func:`check_borrower`), against the loans now
    (``loans``: as the ``lendable`` annotation lists them, by NVML index) and the other borrowers
    kubelet lists (``listed``: its last PodResources read; a borrower being admitted beside this
    one counts too, so the node errs on the side of refusing). A borrower that does not fit is
    refused with the reason (:class:`AssignmentRefused`), never checked against its owners' room
    instead; True tells the agent the owners' check is not asked; False (not a borrower): it is."""
    def vouch(pod: PodView, container: ContainerAssignment) -> bool:
        if not on_loan(pod):
            return False
        borrowers = [p for p in listed() if on_loan(p)]
        check_borrower(node, inventory(), pod, container, loans(), borrowers)
        return True

    return vouch


class LendingSetup:
    """Holds the parts between the two steps."""

    def __init__(self, node: str, resources: ResourceNames, options: LendingOptions,
                 kubeconfig: str | None = None) -> None:
        self.names = LendingNames(resources.domain)
        self.options = options
        self.pods = LendingPods(resources, self.names, options.threshold)
        self.kube = KubeLending(node, self.names, kubeconfig)
        self.store = CheckpointStore(options.checkpoint_root, options.deadline_s)
        tool, bound = find_cuda_checkpoint(), options.cuda_checkpoint_timeout_s
        self.cuda = CudaCheckpoint(tool, bound) if tool and bound > 0 else None
        log.info("checkpoint protocol: directories under %s, deadline %g s; cuda-checkpoint %s",
                 options.checkpoint_root, options.deadline_s,
                 f"at {tool}: suspends what outlives the deadline (up to {bound:g} s)" if self.cuda
                 else f"at {tool}, not run (--cuda-checkpoint-timeout 0)" if tool else "not found")
        shared, where = describe_checkpoint_location(options.checkpoint_root)
        (log.info if shared else log.warning)("%s", where)
        a = options.activity
        log.info("owner activity ends a loan: %d %% SM or +%d MiB for %d samples in a row (regions under %s)",
                 a.percent, a.memory_mib, a.samples, options.shim_state_dir or "none")

    def wrap(self, enforcement: Enforcement) -> CheckpointEnforcement:
        """Step 1: the enforcement backend with the checkpoint protocol in every grant."""
        return CheckpointEnforcement(enforcement, self.store, self.pods.get)

    def attach(self, agent: NodeAgent, monitor: UsageMonitor, gate: ContainerGate | None = None) -> LendingService:
        """Step 2: the service, plugged into the agent's device list and Allocate check; ``gate``: the
        kernel's refusal at open where it runs (the rules' refusals are precomputed into it)."""
        def reclaimer(on_stopped: StoppedHook) -> Reclaimer:
            return Reclaimer(ProcfsProcesses(), self.kube, on_stopped=on_stopped, suspender=self.cuda)

        loans = os.path.join(os.path.dirname(monitor.config.state_path) or ".", LOANS_FILE)
        service = LendingService(monitor, lambda: agent.inventory, agent.layout, self.pods, reclaimer,
                                 LendablePublisher(self.kube.write_lendable), agent.devices_changed,
                                 LendingConfig(loans, self.options.deadline_s, self.options.activity,
                                               self.options.shim_state_dir),
                                 ContainerResolver(monitor.directory), gate)
        agent.extra_devices = service.device_list

        def on_loan(pod: PodView) -> bool:
            known = self.pods.get(pod.key)
            return known is not None and known.borrowed

        agent.vouch = borrower_check(agent.node, lambda: agent.inventory, agent.listed_pods, on_loan,
                                     lambda: [loan.offer() for loan in service.loans.values()])
        agent.on_loan = on_loan
        service.start(asyncio.get_running_loop())
        return service
