"""The label that routes kube-scheduler to the replica that binds, while every synced replica is Ready.

Why a label and not readiness: when only the leader was Ready, a Deployment could not roll (a new
replica never became Ready while the old leader held the Lease), so deploy/ used ``Recreate``,
and an upgrade left kube-scheduler with no extender for a new replica's start, cache sync and
Lease take-over. Now every replica whose cache synced is Ready (``/syncz``), a rolling update
brings synced followers up before any old replica stops, and the Service kube-scheduler calls
selects the pod labelled ``gpupool.io/extender-leader: "true"``, which each replica keeps on its own
pod exactly while it would take a bind (it leads and its term caught up:
:meth:`gpupool.extender.service.ExtenderService.unready`). A leader stopped cleanly takes its label
off before it releases the Lease; a follower already synced then leads within the election's
retry period and labels itself (docs/extender.md, "High availability").

A label left on a replica that no longer leads (a partition, a failed patch) costs what a
follower's direct answer costs: ``not the leader``, and kube-scheduler tries again. The label is
re-asserted every interval, so a patch that failed is retried. A leader that died without a clean
stop (SIGKILL, OOM, node loss) cannot take its own label off; while its pod still counts as Ready
(a lost node's pod does until the node controller marks the node, after its monitor grace
period), the Service would send part of kube-scheduler's calls to a dead address. So a replica
that labels itself also takes the label off every other pod that carries it (``unlabel_others``):
it holds the Lease and its term caught up, so no other replica can take a bind, and removing
their label only stops calls that would fail.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

LEADER_LABEL = "gpupool.io/extender-leader"
SYNC_EVERY_S = 0.5
"""How often the label is compared with the replica's state (a new leader is routed to within it)."""


def pod_ref(value: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` split; ``ValueError`` naming the expected form."""
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"--leader-pod: expected NAMESPACE/NAME, got {value!r}")
    return namespace, name


class LeaderLabel:
    """Keeps :data:`LEADER_LABEL` on this replica's pod while ``serving()``, off otherwise."""

    def __init__(self, patch: Callable[[dict[str, Any]], object], serving: Callable[[], bool],
                 *, interval_s: float = SYNC_EVERY_S,
                 unlabel_others: Callable[[], list[str]] | None = None) -> None:
        self.patch = patch
        self.serving = serving
        self.unlabel_others = unlabel_others
        """Takes the label off every other pod carrying it; returns their names (module docstring)."""
        self.others_cleared = False
        """Whether, since this replica last labelled itself, the others' labels were taken off."""
        self.interval_s = interval_s
        self.labelled: bool | None = None
        """What the pod carries as far as we know (None: unknown, so the next sync writes it)."""
        self._thread: threading.Thread | None = None

    def sync(self) -> bool | None:
        """Write the label when it differs from ``serving()``; returns what the pod now carries."""
        wanted = self.serving()
        if wanted != self.labelled:
            self._write(wanted)
        if self.labelled is not True:
            self.others_cleared = False
        elif not self.others_cleared and self.unlabel_others is not None:
            self._clear_others()
        return self.labelled

    def _clear_others(self) -> None:
        try:
            cleared = self.unlabel_others() if self.unlabel_others is not None else []
        except Exception as exc:  # tried again at the next sync
            log.warning("cannot take the extender-leader label off the previous leader's pod: %s", exc)
            return
        for name in cleared:
            log.info("took the label %s off pod %s (a previous leader that did not stop cleanly)",
                     LEADER_LABEL, name)
        self.others_cleared = True

    def clear(self) -> None:
        """Take the label off (a clean stop, before the Lease is released)."""
        self._write(False)

    def _write(self, labelled: bool) -> None:
        try:
            self.patch({"metadata": {"labels": {LEADER_LABEL: "true" if labelled else None}}})
        except Exception as exc:  # the API is down or refuses: try again at the next sync
            self.labelled = None
            log.warning("cannot %s the extender-leader label on this replica's pod: %s",
                        "set" if labelled else "remove", exc)
            return
        if labelled != self.labelled:
            log.info("this replica %s kube-scheduler's calls (label %s)",
                     "now takes" if labelled else "no longer takes", LEADER_LABEL)
        self.labelled = labelled

    def start(self, stop: threading.Event) -> None:
        """Sync every interval on a daemon thread until ``stop`` is set."""
        def loop() -> None:
            while not stop.is_set():
                self.sync()
                stop.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, name="leader-label", daemon=True)
        self._thread.start()
