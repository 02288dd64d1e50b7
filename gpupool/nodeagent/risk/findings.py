"""What counts as a risk on a node's GPUs, and what the agent may do about one.

A risk is a process using a card outside what gpupool granted its container (the Chengyun seed's
"越权行为", overreach, that the control center isolates):

* ``ungranted-card``: a process of a pod container holds a card's device file while that container
  holds no share of the card (a pod that asked for no GPU but sees one, a container that opened a
  card of its neighbour);
* ``over-memory``: the processes of a container use more memory on a card, as the driver reports
  it (NVML, per process), than its grant allows plus the driver's own per-process overhead, whatever
  the isolation backend: with one enforcing, this is the backstop for a container that got past it
  (a static binary, raw ioctls, a zeroed account);
* ``region-tampered``: where the interception library runs, a container's accounting region shows
  less on a card than the driver reports for the container's registered processes there, beyond
  that overhead: its counters were written down from inside (the library enforces what the region
  says, so the container could allocate past its grant);
* ``unregistered-process``: on a card the container shares with others, a process of the container
  holds the card without having registered with the agent, where the interception library runs: it
  bypassed the library (a static binary, a cleared ``LD_PRELOAD``) and so its limits;
* ``stale-heartbeat``: where the interception library runs, a process of the container holds a card
  and registered, but has not renewed its registration (the library's heartbeat) for longer than the
  stale age (three renewal intervals, 30 s by default): it is stopped or frozen, or what registered
  was not the library.

The cluster's policy (``--risk-action``) chooses the action; every risk is also an event on the pod
and a metric, whatever the action.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class RiskKind(StrEnum):
    """The kinds of risk the detector finds (module docstring)."""

    UNGRANTED_CARD = "ungranted-card"
    OVER_MEMORY = "over-memory"
    UNREGISTERED_PROCESS = "unregistered-process"
    REGION_TAMPERED = "region-tampered"
    STALE_HEARTBEAT = "stale-heartbeat"


class RiskAction(StrEnum):
    """What the agent does about a risk (``gpupool node-agent --risk-action``).

    report: an event on the pod and the metrics, nothing else; refuse-opens: besides, the container's
    further opens of the GPU device files are denied where the event source holds opens for a
    verdict (fanotify); evict: besides, the pod is evicted through the Eviction API (its
    PodDisruptionBudget applies); cordon-card: besides, the card is reported unhealthy to kubelet
    and in the node's inventory, so that nothing new is granted there until the risk is gone.
    """

    REPORT = "report"
    REFUSE_OPENS = "refuse-opens"
    EVICT = "evict"
    CORDON_CARD = "cordon-card"


#: The Warning event's reason on the pod, per kind.
EVENT_REASONS = {RiskKind.UNGRANTED_CARD: "GpuRiskUngrantedCard", RiskKind.OVER_MEMORY: "GpuRiskOverMemory",
                 RiskKind.UNREGISTERED_PROCESS: "GpuRiskUnregisteredProcess",
                 RiskKind.REGION_TAMPERED: "GpuRiskRegionTampered", RiskKind.STALE_HEARTBEAT: "GpuRiskStaleHeartbeat"}


@dataclass(frozen=True)
class Risk:
    """One risk: which card, which container, which process (``pid`` 0 for a container-wide one)."""

    kind: RiskKind
    card: int
    namespace: str
    pod: str
    container: str
    container_id: str
    pid: int
    start_time: int
    detail: str

    @property
    def key(self) -> tuple[str, int, str, str, str, int, int]:
        """Identity across detection rounds: the same process (pid and start time) or container."""
        return (self.kind.value, self.card, self.namespace, self.pod, self.container, self.pid, self.start_time)

    def message(self) -> str:
        """The event's text."""
        who = f"pid {self.pid}" if self.pid else "its processes"
        return f"GPU {self.card}: {self.container} ({who}) {self.detail}"
