"""What a container gets for its cards: env vars, device nodes and mounts (the Allocate response body).

The env vars follow the contract in :mod:`gpupool.api.environment`; the node's enforcement backend
adds its own variables and mounts (:mod:`gpupool.nodeagent.isolation`).

Every resource's Allocate for the same container returns the identical grant, so kubelet's merge of
the responses (first value wins, equal values are not a conflict) is exact whatever its order.
"""

from __future__ import annotations

from gpupool.api.environment import CardShare, ContainerEnvironment
from gpupool.core.model import ContainerAssignment
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.types import ContainerGrant, DeviceSpec, GrantExtras

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


class GrantError(ValueError):
    """The assignment names cards this node does not have (or no longer has the same UUID)."""


def compute_percent(compute_milli: int) -> int:
    """A slice's compute share in whole percent for the env: 0 for none (memory-only slices),
    otherwise at least 1 (a share below 1 % is still a share)."""
    return max(1, compute_milli // 10) if compute_milli > 0 else 0


def build_grant(pod_key: str, assignment: ContainerAssignment, uuids: dict[int, str] | None,
                inventory: GpuInventory, extras: GrantExtras | None = None) -> ContainerGrant:
    """Env vars and device specs for exactly the assigned cards of one container, plus what the
    enforcement backend adds (``extras``; its variables never replace the contract's own)."""
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
        paths.extend(inventory.access_devices(s.card))
    shares = tuple(CardShare(s.card, c.uuid, s.memory_mib, compute_percent(s.compute))
                   for s, c in zip(assignment.slices, cards, strict=True))
    envs = ContainerEnvironment(pod=pod_key, container=assignment.container, cards=shares).to_env()
    # two MIG devices of one card share its device node: each node is listed once
    devices = [DeviceSpec(host_path=p, container_path=p, permissions="rw") for p in dict.fromkeys(paths)]
    devices += [DeviceSpec(host_path=p, container_path=p, permissions="rw") for p in CONTROL_DEVICES]
    if extras is None:
        return ContainerGrant(envs=envs, devices=tuple(devices))
    clash = sorted(k for k in extras.envs if k in envs)
    if clash:
        raise GrantError(f"{pod_key}/{assignment.container}: the enforcement backend would replace {', '.join(clash)}")
    return ContainerGrant(envs={**envs, **extras.envs}, devices=tuple(devices), mounts=extras.mounts)
