"""Whether a pod's holder is undecided: the agent has not listed its node's pods yet (bounded).

Why: a process of a pod is an infrastructure holder only by its pod (``--infrastructure-namespaces``:
a pod that asked for no GPU in a namespace the admin listed, docs/monitor.md "Infrastructure pods"),
and the pod watch that names pods starts after the monitor restored its state file. Until its first
list is in, a pod's process cannot be told from a tenant's: the GPU Operator's DCGM exporter,
holding every card at every agent start, would count as a tenant (a card it alone holds looks used,
a restored holder of it could be reported as a risk, owner or victim). So such a holder is
*undecided* meanwhile (:attr:`~gpupool.nodeagent.monitor.usage_state.Holder.undecided`): neither
use nor judged, and no new loan is made of a card it holds.

The wait is bounded, so that a tenant is never exempt for long: once the first list is in every
holder is judged by its pod; a watch that has not listed after ``deadline_s`` (an API server
unreachable at the agent's start) ends the wait with a warning, and the holders are ordinary from
then on (held; judged once named). Where no namespace is listed nothing can be infrastructure, so
nothing is undecided: a pod's holder is ordinary from its first open, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

POD_LIST_WAIT_S = 60.0
"""How long pods' holders stay undecided at most while the pod watch has not listed (the risk
checks wait as long for the agent's first complete list: ``risk.service.LIST_WAIT_S``)."""


class PodListWait:
    """Callable ``namespace → undecided?`` for the recorder: "" asks for a process whose pod is not
    named (its cgroup names a container the directory does not know), a namespace for a holder
    restored from the state file with its pod's names."""

    def __init__(self, listed: Callable[[], bool], namespaces: frozenset[str], *,
                 deadline_s: float = POD_LIST_WAIT_S, clock: Callable[[], float] = time.monotonic) -> None:
        if deadline_s < 0:
            raise ValueError(f"the wait for the pod list must not be negative, got {deadline_s}")
        self._listed = listed
        self._namespaces = namespaces
        self._deadline_s = deadline_s
        self._clock = clock
        self._started = clock()
        self._over = False

    def __call__(self, namespace: str) -> bool:
        """Whether a pod's holder in ``namespace`` ("" when not known) is undecided now."""
        if self._over or not self._namespaces or (namespace and namespace not in self._namespaces):
            return False
        if self._listed():
            self._over = True
            return False
        if self._clock() - self._started < self._deadline_s:
            return True
        self._over = True
        log.warning("the pod watch has not listed this node's pods %g s after the start: pods' processes are "
                    "ordinary holders from now on, not infrastructure (--infrastructure-namespaces): a card "
                    "they hold is held, and the lending rules and the risk checks judge each as a tenant's "
                    "once its pod is named", self._deadline_s)
        return False
