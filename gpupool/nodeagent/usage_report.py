"""What the usage monitor knows, per card and per pod container, for ``/metrics`` and ``/usage``.

Per card: the last sample (utilisation, memory used / total), the recorded state and holders, and
the idle time. Per container: what its processes use on each card (their NVML memory and SM shares,
matched to the container through the holders of the card's device file) next to what its grant
allows there: the assignment's memory and the compute share as the environment contract
(:mod:`gpupool.api.environment`) states it, ``GPUPOOL_MEMORY_LIMIT_MIB`` and
``GPUPOOL_COMPUTE_PERCENT`` (0: no compute limit). A container that holds a card without an
assignment (a GPU taken outside gpupool) is shown with zero limits, so it stands out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpupool.api.usage_report import (
    CardUsageReport,
    ContainerUsageReport,
    NodeUsageReport,
    RemoteClientUsageReport,
)
from gpupool.core.model import GpuCard
from gpupool.nodeagent.container_grant import compute_percent
from gpupool.nodeagent.container_shares import claims_on_cards, grants_of
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.isolation.shim_registry import Heartbeat
from gpupool.nodeagent.monitor.service import UsageMonitor
from gpupool.nodeagent.monitor.usage_state import DeviceState
from gpupool.nodeagent.remote_usage import RemoteClientRow, since_time, used_mib
from gpupool.nodeagent.types import PodView


@dataclass(frozen=True)
class CardUsageRow:
    """One card: sampled use (``None`` when the last sample lacked it), state and holders."""

    card: GpuCard
    path: str
    state: DeviceState
    holders: int
    idle_seconds: float
    utilization_percent: int | None
    memory_used_mib: int | None
    memory_total_mib: int
    infrastructure_holders: int = 0
    """How many of ``holders`` are infrastructure (nvidia-persistenced, DCGM pods: docs/monitor.md)."""


ContainerUsageRow = ContainerUsageReport
"""One pod container on one card: use against its grant (the contract's row, used for both pages)."""


def card_rows(monitor: UsageMonitor, inventory: GpuInventory) -> tuple[CardUsageRow, ...]:
    """Every card of the inventory as the monitor sees it now."""
    state, sample = monitor.state, monitor.last_sample
    rows = []
    for card in inventory.cards:
        path = inventory.device_path(card.index)
        device = state.device(path)
        sampled = sample.card(card.index) if sample is not None else None
        rows.append(CardUsageRow(card, path, device.state if device else DeviceState.FREE,
                                 len(device.holders) if device else 0, monitor.idle_seconds(path),
                                 sampled.utilization_percent if sampled else None,
                                 sampled.memory_used_mib if sampled else None,
                                 sampled.memory_total_mib if sampled else card.memory_mib,
                                 sum(1 for h in device.holders if h.infrastructure) if device else 0))
    return tuple(rows)


_Key = tuple[str, str, str, int]  # namespace, pod, container, card


def container_rows(node: str, monitor: UsageMonitor, inventory: GpuInventory, pods: Iterable[PodView],
                   claims: Iterable[PodView] = ()) -> tuple[ContainerUsageRow, ...]:
    """Containers with a grant on this node's cards or holding one, ordered by name and card. A
    grant is the pod's assignment's or, for a container using DRA claims the node prepared
    (``claims``, :meth:`gpupool.nodeagent.dra.claim_state.ClaimState.as_pods`), the claims' shares
    (:func:`~gpupool.nodeagent.container_shares.grants_of`, the risk checks' reading)."""
    pods, claims = list(pods), list(claims)
    limits: dict[_Key, tuple[int, int]] = {}
    for (namespace, pod_name, container), held in grants_of(node, pods, claims).items():
        for s in held.values():
            limits[(namespace, pod_name, container, s.card)] = (s.memory_mib, compute_percent(s.compute))
    from_claims = claims_on_cards(pods, claims)
    used: dict[_Key, tuple[int, int, int]] = {}
    state, sample = monitor.state, monitor.last_sample
    for card in inventory.cards:
        device = state.device(inventory.device_path(card.index))
        sampled = sample.card(card.index) if sample is not None else None
        processes = {p.pid: p for p in sampled.processes} if sampled else {}
        for holder in device.users if device else ():  # an infrastructure pod is counted on its card only
            if not holder.pod:
                continue
            key = (holder.namespace, holder.pod, holder.container, card.index)
            memory, sm, count = used.get(key, (0, 0, 0))
            process = processes.get(holder.pid)
            if process is not None:
                memory += process.memory_used_mib
                sm += process.sm_percent or 0
            used[key] = (memory, sm, count + 1)
    rows = []
    for key in sorted(limits.keys() | used.keys()):
        memory_limit, share = limits.get(key, (0, 0))
        memory, sm, count = used.get(key, (0, 0, 0))
        rows.append(ContainerUsageRow(*key, memory_used_mib=memory, memory_limit_mib=memory_limit,
                                      sm_percent=min(sm, 100), compute_share_percent=share, processes=count,
                                      claims=from_claims.get(key, ())))
    return tuple(rows)


def usage_report(node: str, monitor: UsageMonitor, inventory: GpuInventory, pods: Iterable[PodView],
                 heartbeats: Mapping[tuple[str, str, str], Heartbeat] | None = None,
                 remote: Iterable[RemoteClientRow] = (), claims: Iterable[PodView] = ()) -> NodeUsageReport:
    """The same as :func:`usage_table`, as the contract's document (``/usage.json``); with
    ``heartbeats`` (where the interception library runs) each row of a container with registered
    processes carries its heartbeat age and stale flag; ``remote`` are the clients the node's GPU
    server serves (:func:`gpupool.nodeagent.remote_usage.remote_client_rows`); ``claims`` the DRA
    claims the node prepared (:func:`container_rows`)."""
    cards = tuple(CardUsageReport(index=r.card.index, uuid=r.card.uuid, model=r.card.model, state=r.state.value,
                                  utilization_percent=r.utilization_percent, memory_used_mib=r.memory_used_mib,
                                  memory_total_mib=r.memory_total_mib, holders=r.holders,
                                  idle_seconds=float(r.idle_seconds), infrastructure_holders=r.infrastructure_holders)
                  for r in card_rows(monitor, inventory))
    containers = container_rows(node, monitor, inventory, pods, claims)
    if heartbeats:
        containers = tuple(_with_heartbeat(row, _heartbeat_of(row, heartbeats)) for row in containers)
    source = monitor.source.name if monitor.source is not None else "none"
    remote_clients = tuple(RemoteClientUsageReport(
        r.namespace, r.pod, r.card, r.uuid, r.memory_mib, r.compute_percent, r.connections,
        memory_used_mib=None if r.memory_used_bytes is None else used_mib(r.memory_used_bytes),
        connected_since=None if r.connected_since is None else since_time(r.connected_since),
        sm_percent=r.sm_percent) for r in remote)
    return NodeUsageReport(node, source, float(monitor.config.idle_after), cards, containers, remote_clients)


def _heartbeat_of(row: ContainerUsageRow, heartbeats: Mapping[tuple[str, str, str], Heartbeat]) -> Heartbeat | None:
    """The row's container's heartbeat: its own registration's or, for a container whose grant came
    from DRA claims, the stalest of its claims' (the library registers a claim's processes under the
    claim's name, ``GPUPOOL_CONTAINER``, shared by every container using the claim)."""
    own = heartbeats.get((row.namespace, row.pod, row.container))
    if own is not None and own.processes:
        return own
    beats = [b for b in (heartbeats.get((row.namespace, row.pod, claim)) for claim in row.claims)
             if b is not None and b.processes]
    return max(beats, key=lambda b: b.age_s, default=own)


def _with_heartbeat(row: ContainerUsageRow, beat: Heartbeat | None) -> ContainerUsageRow:
    if beat is None or not beat.processes:
        return row
    return replace(row, heartbeat_age_seconds=round(beat.age_s, 3), heartbeat_stale=beat.stale)


def usage_table(node: str, monitor: UsageMonitor, inventory: GpuInventory, pods: Iterable[PodView],
                claims: Iterable[PodView] = ()) -> str:
    """The ``/usage`` page: a per-card table, then a per-container table (plain text; ``CLAIMS``
    names the DRA claims a container's grant on the card came from, ``-`` for an assignment's)."""
    source = monitor.source.name if monitor.source is not None else "none"
    lines = [f"node {node}  event source: {source}  idle after: {monitor.config.idle_after:g} s", "",
             f"{'CARD':<5}{'MODEL':<16}{'STATE':<7}{'UTIL%':>6}{'MEM USED/TOTAL MiB':>22}{'HOLDERS':>9}"
             f"{'IDLE s':>9}"]
    for row in card_rows(monitor, inventory):
        util = "-" if row.utilization_percent is None else str(row.utilization_percent)
        used = "-" if row.memory_used_mib is None else str(row.memory_used_mib)
        lines.append(f"{row.card.index:<5}{row.card.model[:15]:<16}{row.state:<7}{util:>6}"
                     f"{used + '/' + str(row.memory_total_mib):>22}{_holders_cell(row):>9}"
                     f"{row.idle_seconds:>9.0f}")
    lines += ["", f"{'NAMESPACE/POD/CONTAINER':<48}{'CARD':>5}{'MEM USED/LIMIT MiB':>20}{'SM%/SHARE%':>12}"
                  f"{'PROCS':>7}  CLAIMS"]
    for c in container_rows(node, monitor, inventory, pods, claims):
        name = f"{c.namespace}/{c.pod}/{c.container or '?'}"
        share = str(c.compute_share_percent) if c.compute_share_percent else "-"
        lines.append(f"{name[:47]:<48}{c.card:>5}{f'{c.memory_used_mib}/{c.memory_limit_mib}':>20}"
                     f"{f'{c.sm_percent}/{share}':>12}{c.processes:>7}  {','.join(c.claims) or '-'}")
    return "\n".join(lines) + "\n"


def _holders_cell(row: CardUsageRow) -> str:
    """``3``, or ``3 (1i)`` when one of the three is an infrastructure holder."""
    return f"{row.holders} ({row.infrastructure_holders}i)" if row.infrastructure_holders else str(row.holders)
