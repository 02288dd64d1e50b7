"""Refuse further opens of the GPU device files by containers found risky (``refuse-opens``).

A separate decider the agent chains with the others (the lending rules' own): the first that
denies wins, and one that fails allows (a bug must not lock a GPU away from everyone). The fast
path, no container blocked, reads nothing; otherwise the opener's cgroup names its container. It is
enforced by an event source that holds opens for a verdict (fanotify) and, where the kernel's
cgroup-device gate runs (:meth:`RiskOpenDecider.use_gate`), by the kernel itself: every change of
the blocked set is handed to the gate, which refuses the blocked containers' opens of the cards.
With neither (the /proc scan alone) nothing is refused, which
:class:`~gpupool.nodeagent.risk.responder.RiskResponder` says in the pod's event.

The blocked set is replaced, never mutated, so the source's thread reads it without a lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind, OpenDecider, Verdict

log = logging.getLogger(__name__)

CgroupOf = Callable[[int], CgroupIdentity]


class RiskOpenDecider:
    """Denies opens by processes of blocked containers (by container ID)."""

    def __init__(self, cgroup_of: CgroupOf) -> None:
        self._cgroup_of = cgroup_of
        self._blocked: Mapping[str, str] = {}
        self._pods: dict[str, tuple[str, str]] = {}
        self._gate: Callable[[Mapping[str, str]], None] | None = None
        self.denied = 0

    def use_gate(self, apply: Callable[[Mapping[str, str]], None]) -> None:
        """Hand every new blocked set (container ID → why) to ``apply`` (the kernel's gate)."""
        self._gate = apply
        self._changed()

    @property
    def gated(self) -> bool:
        """Whether the kernel's gate enforces the blocked set."""
        return self._gate is not None

    def _changed(self) -> None:
        if self._gate is None:
            return
        try:
            self._gate(self._blocked)
        except Exception:
            log.exception("risk: cannot update the device gate")

    @property
    def blocked(self) -> Mapping[str, str]:
        """Container ID → why it is blocked."""
        return self._blocked

    def block(self, container_id: str, reason: str, pod: tuple[str, str] = ("", "")) -> None:
        """Deny this container's further opens (for as long as its pod, (namespace, name), lives)."""
        if container_id and container_id not in self._blocked:
            self._pods[container_id] = pod
            self._blocked = {**self._blocked, container_id: reason}
            self._changed()

    def keep_only(self, container_ids: Iterable[str]) -> None:
        """Forget blocked containers not among ``container_ids`` (those that are gone)."""
        alive = set(container_ids)
        if not set(self._blocked) <= alive:
            self._blocked = {cid: why for cid, why in self._blocked.items() if cid in alive}
            self._pods = {cid: pod for cid, pod in self._pods.items() if cid in alive}
            self._changed()

    def keep_pods(self, pods: Iterable[tuple[str, str]]) -> None:
        """Forget blocked containers whose pod is not among ``pods`` (deleted: a recreated pod of the
        same name has new containers, whose IDs were never blocked)."""
        live = set(pods)
        self.keep_only(cid for cid, pod in self._pods.items() if pod in live)

    def __call__(self, event: DeviceEvent) -> Verdict:
        blocked = self._blocked
        if not blocked or event.kind is not EventKind.OPEN:
            return Verdict.ALLOW
        container_id = self._cgroup_of(event.pid).container_id
        if container_id in blocked:
            self.denied += 1
            log.warning("denied pid %d opening %s: its container %s is isolated (%s)", event.pid, event.path,
                        container_id[:12], blocked[container_id])
            return Verdict.DENY
        return Verdict.ALLOW


def chain_deciders(*deciders: OpenDecider) -> OpenDecider:
    """One decider asking each in turn: the first DENY wins; a decider that raises counts as ALLOW."""

    def decide(event: DeviceEvent) -> Verdict:
        for decider in deciders:
            try:
                if decider(event) is Verdict.DENY:
                    return Verdict.DENY
            except Exception:
                log.exception("open decider %r failed for %s by pid %d; it allows", decider, event.path, event.pid)
        return Verdict.ALLOW

    return decide
