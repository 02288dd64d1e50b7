"""What a container gets for its cards: env vars and device nodes (the Allocate response body).

Env vars, per container, cards in the order the scheduler exposed them:

* ``NVIDIA_VISIBLE_DEVICES``: card UUIDs (read by the NVIDIA container runtime);
* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: ``0=4096M,1=4096M`` (ordinal within the container);
* ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: the smallest per-card compute share, in percent (MPS takes
  one value per client); a slice without a compute share (memory only, gpushare's meaning: it
  shares compute best-effort) does not limit it, so a memory-only container gets 100, not 1;
* ``GPUPOOL_MEMORY_LIMIT_MIB`` / ``GPUPOOL_COMPUTE_PERCENT`` / ``GPUPOOL_CARD_INDICES`` /
  ``GPUPOOL_CARD_UUIDS``: the same per card, comma-separated, for gpupool's own enforcement;
* ``GPUPOOL_POD`` / ``GPUPOOL_CONTAINER``: whose assignment this is, so a mix-up is visible in logs.

Every resource's Allocate for the same container returns the identical grant, so kubelet's merge of
the responses (first value wins, equal values are not a conflict) is exact whatever its order.
"""

from __future__ import annotations

from gpupool.core.model import ContainerAssignment
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.types import ContainerGrant, DeviceSpec

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


class GrantError(ValueError):
    """The assignment names cards this node does not have (or no longer has the same UUID)."""


def compute_percent(compute_milli: int) -> int:
    """A slice's compute share in whole percent for the env: 0 for none (memory-only slices),
    otherwise at least 1 (a share below 1 % is still a share)."""
    return max(1, compute_milli // 10) if compute_milli > 0 else 0


def build_grant(pod_key: str, assignment: ContainerAssignment, uuids: dict[int, str] | None,
                inventory: GpuInventory) -> ContainerGrant:
    """Env vars and device specs for exactly the assigned cards of one container."""
    cards, paths = [], []
    for s in assignment.slices:
        try:
            card = inventory.card(s.card)
        except KeyError as exc:
            raise GrantError(f"{pod_key}/{assignment.container}: {exc}") from exc
        expected = (uuids or {}).get(s.card)
        if expected and expected != card.uuid:
            raise GrantError(f"{pod_key}/{assignment.container}: card {s.card} is {card.uuid} on this node,"
                             f" the scheduler assigned {expected}")
        cards.append(card)
        paths.append(inventory.device_path(s.card))
    percents = [compute_percent(s.compute) for s in assignment.slices]
    limited = [p for p in percents if p > 0]
    envs = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(c.uuid for c in cards),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": ",".join(f"{i}={s.memory_mib}M"
                                                     for i, s in enumerate(assignment.slices)),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(min(limited) if limited else 100),
        "GPUPOOL_MEMORY_LIMIT_MIB": ",".join(str(s.memory_mib) for s in assignment.slices),
        "GPUPOOL_COMPUTE_PERCENT": ",".join(str(p) for p in percents),
        "GPUPOOL_CARD_INDICES": ",".join(str(s.card) for s in assignment.slices),
        "GPUPOOL_CARD_UUIDS": ",".join(c.uuid for c in cards),
        "GPUPOOL_POD": pod_key,
        "GPUPOOL_CONTAINER": assignment.container,
    }
    devices = [DeviceSpec(host_path=p, container_path=p, permissions="rw") for p in paths]
    devices += [DeviceSpec(host_path=p, container_path=p, permissions="rw") for p in CONTROL_DEVICES]
    return ContainerGrant(envs=envs, devices=tuple(devices))
