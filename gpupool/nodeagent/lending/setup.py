"""Assembling the lending side for ``gpupool node-agent --lending``.

Built before the node agent, which is handed the result (:class:`LoanedCapacity`, the agent's
:class:`~gpupool.nodeagent.agent.LentCapacity`) in its constructor: the grant's checkpoint extras wrap
the enforcement backend (:meth:`LendingSetup.wrap`), then :meth:`LendingSetup.build` makes the
service and its capacity. The service reads the agent's cards, listed pods and device-list wake-up
through callables (:class:`gpupool.nodeagent.agent_link.AgentLink`), answered once the agent exists.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable

from gpupool.api.lending import LendableCard, LendingNames
from gpupool.api.names import ResourceNames
from gpupool.core.model import ContainerAssignment
from gpupool.nodeagent.containers.container_gate import ContainerGate
from gpupool.nodeagent.device_layout import DeviceLayout
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.isolation.backends import Enforcement
from gpupool.nodeagent.lending.checkpoint import (
    CheckpointEnforcement,
    CheckpointStore,
    find_cuda_checkpoint,
    namespace_dir_name,
    task_dir_name,
)
from gpupool.nodeagent.lending.checkpoint_location import describe as describe_checkpoint_location
from gpupool.nodeagent.lending.checkpoint_retention import CheckpointRetention
from gpupool.nodeagent.lending.claims import PreparedClaims
from gpupool.nodeagent.lending.criu_tools import prepare_criu_tools
from gpupool.nodeagent.lending.cuda_suspend import CudaCheckpoint
from gpupool.nodeagent.lending.kube_io import KubeLending
from gpupool.nodeagent.lending.options import LendingOptions
from gpupool.nodeagent.lending.pods import LendingPods
from gpupool.nodeagent.lending.processes import ProcfsProcesses
from gpupool.nodeagent.lending.publisher import LendablePublisher
from gpupool.nodeagent.lending.reclaim import Reclaimer, StoppedHook
from gpupool.nodeagent.lending.rules import PodKey
from gpupool.nodeagent.lending.service import LendingConfig, LendingService
from gpupool.nodeagent.monitor.service import UsageMonitor
from gpupool.nodeagent.schedule_check import check_borrower
from gpupool.nodeagent.types import PodView

log = logging.getLogger(__name__)

LOANS_FILE = "lending.json"


Vouch = Callable[[PodView, ContainerAssignment], bool]


def borrower_check(node: str, inventory: Callable[[], GpuInventory], listed: Callable[[], list[PodView]],
                   on_loan: Callable[[PodView], bool], loans: Callable[[], Iterable[LendableCard]]) -> Vouch:
    """The agent's Allocate check of a borrower (:meth:`LoanedCapacity.vouch`): the core's lent rule, as the
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


class LoanedCapacity:
    """The lending part as the node agent consults it (:class:`~gpupool.nodeagent.agent.LentCapacity`):
    the service's lent devices, which pods borrow, and the borrower check. Also what the agent runs
    (:meth:`run`) and starts (:meth:`start`) of lending."""

    def __init__(self, node: str, service: LendingService, pods: LendingPods, inventory: Callable[[], GpuInventory],
                 listed: Callable[[], list[PodView]], retention: CheckpointRetention | None = None) -> None:
        self.service = service
        self.retention = retention
        """The sweep of idle task checkpoint directories (``None``: none, as in tests of the service alone)."""
        self._pods = pods
        self._vouch = borrower_check(node, inventory, listed, self.on_loan,
                                     lambda: [loan.offer() for loan in service.loans.values()])

    def use_claims(self, prepared: PreparedClaims) -> None:
        """Book the DRA driver's prepared claims for the containers that use them (``--dra``):
        :mod:`gpupool.nodeagent.lending.claims`."""
        self._pods.use_claims(prepared)

    def extra_devices(self, resource: str) -> list[tuple[str, bool]]:
        return self.service.device_list(resource)

    def vouch(self, pod: PodView, container: ContainerAssignment) -> bool:
        return self._vouch(pod, container)

    def on_loan(self, pod: PodView) -> bool:
        known = self._pods.get(pod.key)
        return known is not None and known.borrowed

    def start_refusal(self, pod: PodView) -> str | None:
        return self.service.start_refusal(pod.key, pod.uid)

    def start(self) -> None:
        """Resume the previous agent's loans and hook the rules into the monitor (on the running loop)."""
        self.service.start(asyncio.get_running_loop())

    async def run(self) -> None:
        """The lending loop and the checkpoint retention sweep, until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.service.run())
            if self.retention is not None:
                group.create_task(self.retention.run())


class LendingSetup:
    """Holds the lending parts while the agent is assembled."""

    def __init__(self, node: str, resources: ResourceNames, options: LendingOptions,
                 kubeconfig: str | None = None) -> None:
        self.resources = resources
        self.names = LendingNames(resources.domain)
        self.options = options
        self.pods = LendingPods(self.names, options.threshold)
        self.kube = KubeLending(node, self.names, kubeconfig)
        self.store = CheckpointStore(options.checkpoint_root, options.deadline_s)
        tool, bound = find_cuda_checkpoint(), options.cuda_checkpoint_timeout_s
        self.cuda = CudaCheckpoint(tool, bound) if tool and bound > 0 else None
        self.criu_tools = prepare_criu_tools(options.criu, options.criu_tools_dir, tool) if options.criu else None
        self.enforcement: CheckpointEnforcement | None = None
        """The wrapped backend (:meth:`wrap`), told of each grant once the service exists (:meth:`build`)."""
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
        self.enforcement = CheckpointEnforcement(enforcement, self.store, self.pods.get, self.criu_tools)
        return self.enforcement

    def build(self, node: str, monitor: UsageMonitor, inventory: Callable[[], GpuInventory],
              listed: Callable[[], list[PodView]], devices_changed: Callable[[], Awaitable[None]],
              gate: ContainerGate | None = None) -> LoanedCapacity:
        """Step 2: the service and the capacity the agent is built with. ``inventory``, ``listed`` and
        ``devices_changed``: the agent's cards, the pods kubelet lists and its device-list wake-up
        (read only once it runs); ``gate``: the kernel's refusal at open where it runs (the rules'
        refusals are precomputed into it)."""
        def reclaimer(on_stopped: StoppedHook) -> Reclaimer:
            return Reclaimer(ProcfsProcesses(), self.kube, on_stopped=on_stopped, suspender=self.cuda)

        loans = os.path.join(os.path.dirname(monitor.config.state_path) or ".", LOANS_FILE)
        service = LendingService(monitor, inventory, DeviceLayout(self.resources), self.pods, reclaimer,
                                 LendablePublisher(self.kube.write_lendable), devices_changed,
                                 LendingConfig(loans, self.options.deadline_s, self.options.activity,
                                               self.options.shim_state_dir),
                                 monitor.resolver(), gate)
        if self.enforcement is not None:  # an owner granted a share of a lent card: its loan shrinks, it waits
            self.enforcement.granted = service.owner_granted
        retention = CheckpointRetention(self.store, self.options.checkpoint_retention_s,
                                        lambda: task_dirs_in_use(self.pods, service.reclaiming))
        return LoanedCapacity(node, service, self.pods, inventory, listed, retention)


def task_dirs_in_use(pods: LendingPods, reclaiming: Iterable[PodKey]) -> set[tuple[str, str]] | None:
    """The checkpoint directories (namespace directory, task directory) of this node's pods and of the
    reclaims in progress, which the retention sweep keeps; ``None`` until the pods were listed whole."""
    if not pods.synced:
        return None
    tasks = {(p.namespace, p.checkpoint_key) for p in pods.all()}
    for namespace, name in reclaiming:  # a pod gone from the list whose reclaim still runs
        known = pods.get((namespace, name))
        tasks.add((namespace, known.checkpoint_key if known is not None else f"{namespace}/{name}"))
    return {(namespace_dir_name(namespace), task_dir_name(key)) for namespace, key in tasks}
