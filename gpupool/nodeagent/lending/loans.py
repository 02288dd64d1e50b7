"""Which cards are lent now, with whose idle hold, and the file that lets a restarted agent resume.

A card is lent from the moment the usage monitor calls it idle (held, no SM activity for
``--idle-after``) until one of its owners (the containers that held it then, not borrowers) opens it
again or leaves the node. Its lendable memory is what its holders leave free in the last usage
sample (rounded down to the memory unit); its compute is the whole card (idle: nobody computes).
A card is not lent while a holder without a gpupool share of it is high priority: a borrower's
first open would be refused (rule 3), nor while a process the node cannot name holds it (it could
not be given back), except an infrastructure holder, which keeps the device open on every GPU
node and does no work on it: a host daemon the monitor names so (``--infrastructure-holders``:
nvidia-persistenced, DCGM), or a pod that booked no GPU in an infrastructure namespace
(``--infrastructure-namespaces``: the GPU Operator's DaemonSets), whatever its priority.

The loans are written to a small JSON file next to the monitor's state after every change, so an
agent restarted mid-lend keeps the same owners dormant (their holds do not refuse the borrowers
already running) and still returns the card when an owner opens it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpupool.api.lending import LendableCard, Priority
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.lending.durable import write_json_atomically
from gpupool.nodeagent.lending.pods import LendingPod
from gpupool.nodeagent.lending.rules import ContainerKey
from gpupool.nodeagent.monitor.usage_sampling import UsageSample
from gpupool.nodeagent.monitor.usage_state import DeviceState, UsageState
from gpupool.nodeagent.types import MEMORY_UNIT

log = logging.getLogger(__name__)

LOANS_VERSION = 1
FULL_COMPUTE_PERCENT = 100


@dataclass(frozen=True)
class Loan:
    """One lent card: its owners (dormant until they open it again) and what a borrower may take."""

    card: int
    uuid: str
    path: str
    owners: frozenset[ContainerKey]
    memory_mib: int
    compute_percent: int
    idle_since: float

    @property
    def first_owner(self) -> ContainerKey:
        return min(self.owners)

    def offer(self) -> LendableCard:
        """The card as the ``lendable`` annotation lists it."""
        namespace, pod, container = self.first_owner
        return LendableCard(self.card, self.uuid, f"{namespace}/{pod}", container, self.memory_mib,
                            self.compute_percent, self.idle_since)


def new_loans(state: UsageState, cards: Mapping[str, int], inventory: GpuInventory, sample: UsageSample | None,
              pod_of: Callable[[tuple[str, str]], LendingPod | None], lent: Iterable[int]) -> list[Loan]:
    """Idle cards not lent yet that may be lent now."""
    already = set(lent)
    found = []
    for device in state.devices:
        card = cards.get(device.path)
        if card is None or card in already or device.state is not DeviceState.IDLE or not device.holders:
            continue
        owners: set[ContainerKey] = set()
        refused = False
        for holder in device.users:  # an infrastructure holder (a host daemon, a DCGM pod) is neither owner nor bar
            pod = pod_of((holder.namespace, holder.pod)) if holder.pod else None
            if pod is None or not holder.container:
                refused = True  # a holder the node cannot name: never lend what it cannot give back
                break
            if pod.borrowed:
                continue
            if card not in pod.booked.get(holder.container, frozenset()) and pod.priority is Priority.HIGH:
                refused = True
                break
            owners.add((holder.namespace, holder.pod, holder.container))
        if refused or not owners:
            continue
        info = next((c for c in inventory.cards if c.index == card), None)
        if info is None or not info.healthy:
            continue
        usage = sample.card(card) if sample is not None else None
        used = usage.memory_used_mib if usage is not None else info.memory_mib
        free = max(0, info.memory_mib - used) // MEMORY_UNIT * MEMORY_UNIT
        if free <= 0:
            continue
        since = device.last_use if device.last_use is not None else state.updated
        found.append(Loan(card, info.uuid, device.path, frozenset(owners), free, FULL_COMPUTE_PERCENT, since))
    return found


class LoanFile:
    """The loans on disk (JSON, written atomically: :mod:`~gpupool.nodeagent.lending.durable`); a missing or
    unreadable file is no loans."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> list[Loan]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                doc = json.load(fh)
            if doc.get("version") != LOANS_VERSION:
                raise ValueError(f"version {doc.get('version')!r}")
            return [Loan(int(x["card"]), str(x["uuid"]), str(x["path"]),
                         frozenset((str(a), str(b), str(c)) for a, b, c in x["owners"]),
                         int(x["memoryMiB"]), int(x["computePercent"]), float(x["idleSince"]))
                    for x in doc["loans"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("ignoring the lending file %s: %s", self.path, exc)
            return []

    def save(self, loans: Iterable[Loan]) -> None:
        doc = {"version": LOANS_VERSION, "loans": [
            {"card": x.card, "uuid": x.uuid, "path": x.path, "owners": sorted(x.owners), "memoryMiB": x.memory_mib,
             "computePercent": x.compute_percent, "idleSince": x.idle_since}
            for x in sorted(loans, key=lambda x: x.card)]}
        write_json_atomically(self.path, doc)
