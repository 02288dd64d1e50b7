"""Build the usage monitor for a node agent: what it watches, what it samples, whom it tells.

Watched: every card's device node from the inventory plus the control devices every GPU container
opens (``/dev/nvidiactl``, ``/dev/nvidia-uvm*``). Sampled: the GPU backend (NVML, or the fake
backend's ``usage`` script). Told: the pods holding a card when it goes busy → idle or idle → busy,
as a Kubernetes Event on each such pod (``reason`` :data:`IDLE_REASON` / :data:`BUSY_REASON`); an
infrastructure pod (a DCGM exporter on every card) is not told: the card's state is not its use.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from gpupool.nodeagent.gpu_inventory import GpuBackend, GpuInventory
from gpupool.nodeagent.monitor.events import OpenDecider, allow_every_open
from gpupool.nodeagent.monitor.service import MonitorConfig, StateChange, StateListener, UsageMonitor
from gpupool.nodeagent.monitor.usage_sampling import UsageSample
from gpupool.nodeagent.monitor.usage_state import DeviceState, counts_as_use
from gpupool.nodeagent.nvml.backend import CONTROL_DEVICES

log = logging.getLogger(__name__)

IDLE_REASON = "GpuIdle"
BUSY_REASON = "GpuBusy"

PostEvent = Callable[[str, str, str, str], Awaitable[None]]
"""(namespace, pod, reason, message) → posts a Normal event about the pod."""


class BackendSampler:
    """The backend's ``sample_usage`` as the monitor's :class:`UsageSampler`."""

    def __init__(self, backend: GpuBackend) -> None:
        self._backend = backend

    def sample(self) -> UsageSample:
        """One sample of every card."""
        return self._backend.sample_usage()


def card_paths(inventory: GpuInventory) -> dict[str, int]:
    """Card device path → card index."""
    return {inventory.device_path(card.index): card.index for card in inventory.cards}


def build_monitor(node: str, backend: GpuBackend, config: MonitorConfig,
                  on_change: StateListener | None = None, decide: OpenDecider = allow_every_open) -> UsageMonitor:
    """A monitor of this node's cards and control devices, sampling ``backend`` (not started);
    ``decide`` answers the opens a deciding source holds (the risk checks' refusals)."""
    return UsageMonitor(node, card_paths(backend.inventory()), CONTROL_DEVICES, BackendSampler(backend),
                        config, on_change=on_change, decide=decide)


def change_message(change: StateChange, idle_after: float) -> str:
    """What the event on a holding pod says."""
    holders = ", ".join(f"{h.container or '?'} (pid {h.pid})" for h in change.holders
                        if h.pod and counts_as_use(h))
    if change.current is DeviceState.IDLE:
        return (f"GPU {change.card} ({change.path}) idle: no SM activity for {idle_after:g} s "
                f"while held by {holders}")
    return f"GPU {change.card} ({change.path}) busy again, held by {holders}"


def pod_event_listener(post: PostEvent, idle_after: float) -> StateListener:
    """A listener posting one event per distinct pod among the card's holders."""

    async def listener(change: StateChange) -> None:
        reason = IDLE_REASON if change.current is DeviceState.IDLE else BUSY_REASON
        pods = sorted({(h.namespace, h.pod) for h in change.holders if h.pod and counts_as_use(h)})
        if not pods:
            log.debug("card %d went %s; no holder is in a known pod, no event", change.card, change.current)
        for namespace, pod in pods:
            await post(namespace, pod, reason, change_message(change, idle_after))

    return listener
