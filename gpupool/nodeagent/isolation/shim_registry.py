"""Who may register and who did: tokens handed out, and the processes registered per container.

A registration is accepted when the token is one Allocate handed out, the connecting process (its
pid from ``SO_PEERCRED``, in the agent's pid namespace) still exists, the names it claims are the
token's, and, when its cgroup names a pod or a container the agent knows, those are the token's
too. A process whose cgroup names nothing known (a runtime naming the agent cannot read, or a test
outside any container) is accepted on its token alone; the reply says nothing different, the log
does. Processes are kept as (pid, start time): a pid reused by another process is not mistaken
for the registered one, and dead ones are pruned whenever the table is read.

Registration is also the container's heartbeat (docs/isolation.md, "Heartbeat"): the reply tells
the library to send the same line again every :attr:`ShimRegistry.heartbeat_s`, and a registered
process's line again is a renewal: its ``renewed_at`` moves on. A renewal sooner than half the
interval after the last one is answered yes but not recorded (nor its /proc and cgroup read), so a
process cannot make the agent work harder by renewing in a loop. A process whose last renewal is
older than :attr:`ShimRegistry.stale_after_s` while it holds a card is what the risk checks call a
``stale-heartbeat``: stopped, frozen, or registered by something other than the library. A process
that exits is pruned and a container that ends is forgotten (:meth:`ShimRegistry.forget`), so the
table holds only the living.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from gpupool.api.shim_contract import MAX_RENEW_S, RegisterReply, RegisterRequest
from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity
from gpupool.nodeagent.containers.container_directory import ContainerDirectory
from gpupool.nodeagent.linux.procfs import PROC, process_start_time

log = logging.getLogger(__name__)

HEARTBEAT_S = 10
"""How often the library renews its registration (the reply's ``renewS``)."""
STALE_AFTER_RENEWALS = 3
"""A process is stale after this many intervals without a renewal (one lost renewal is not enough)."""

ContainerKey = tuple[str, str]
"""(pod UID, container name)."""


@dataclass
class TokenOwner:
    """The container a token was handed to; the pod's names once known (after an agent restart
    only the UID and container are, until the pod is listed again)."""

    pod_uid: str
    container: str
    namespace: str = ""
    pod: str = ""


@dataclass(frozen=True)
class RegisteredProcess:
    """One registered process: host pid, the pid it reported (its own namespace's), start time, and
    when it registered and last renewed (the agent's clock)."""

    pid: int
    reported_pid: int
    start_time: int
    registered_at: float
    renewed_at: float = 0.0

    @property
    def last_seen(self) -> float:
        """Its registration or its last renewal, whichever is later."""
        return max(self.registered_at, self.renewed_at)


@dataclass(frozen=True)
class Heartbeat:
    """One container's heartbeat: its live registered processes and how long ago the one renewed
    least recently did (``age_s``, 0 without processes), and whether that is past the stale age."""

    processes: int
    age_s: float
    stale: bool


@dataclass
class RegistryStats:
    """Counters for metrics: accepted registrations and refusals by reason class."""

    accepted: int = 0
    renewed: int = 0
    throttled: int = 0
    """Renewals answered but not recorded: sooner than half the interval after the last one."""
    refused: dict[str, int] = field(default_factory=dict)

    def refuse(self, kind: str) -> None:
        self.refused[kind] = self.refused.get(kind, 0) + 1


CgroupReader = Callable[[int], CgroupIdentity]


class ShimRegistry:
    """Tokens handed out and the processes that registered with them."""

    def __init__(self, cgroup_of: CgroupReader, directory: ContainerDirectory | None = None,
                 proc: str = PROC, clock: Callable[[], float] = time.time, heartbeat_s: int = HEARTBEAT_S) -> None:
        if not 1 <= heartbeat_s <= MAX_RENEW_S:
            raise ValueError(f"the heartbeat interval must be 1 to {MAX_RENEW_S} s, got {heartbeat_s}")
        self.heartbeat_s = heartbeat_s
        """Seconds between a library's renewals (sent in every accepted reply)."""
        self.stale_after_s = float(STALE_AFTER_RENEWALS * heartbeat_s)
        """A process not renewed for this long is stale."""
        self._cgroup_of = cgroup_of
        self._directory = directory
        self._proc = proc
        self._clock = clock
        self._owners: dict[str, TokenOwner] = {}
        self._tokens: dict[ContainerKey, str] = {}
        self._processes: dict[ContainerKey, dict[int, RegisteredProcess]] = {}
        self.stats = RegistryStats()

    # ---------------------------------------------------------------------------------- tokens
    def issue(self, token: str, pod_uid: str, container: str, namespace: str = "", pod: str = "") -> None:
        """Record that ``token`` was handed to (pod UID, container)."""
        owner = self._owners.get(token)
        if owner is None:
            owner = self._owners[token] = TokenOwner(pod_uid, container)
            self._tokens[(pod_uid, container)] = token
        if namespace and pod:
            owner.namespace, owner.pod = namespace, pod

    def owner(self, token: str) -> TokenOwner | None:
        return self._owners.get(token)

    def containers(self) -> list[ContainerKey]:
        """Every container a token was handed to."""
        return list(self._tokens)

    def name_pods(self, names: Mapping[str, tuple[str, str]]) -> None:
        """Fill in pod names of owners known only by UID (pod UID → (namespace, name))."""
        for owner in self._owners.values():
            found = names.get(owner.pod_uid)
            if found is not None and not owner.pod:
                owner.namespace, owner.pod = found

    def forget(self, key: ContainerKey) -> None:
        """The container is gone: its token and processes with it."""
        token = self._tokens.pop(key, None)
        if token is not None:
            self._owners.pop(token, None)
        self._processes.pop(key, None)

    # ---------------------------------------------------------------------------- registering
    def register(self, request: RegisterRequest, peer_pid: int | None) -> RegisterReply:
        """Check one request from the process ``peer_pid``; record it when accepted."""
        owner = self._owners.get(request.token)
        if owner is None:
            return self._refuse("token", "unknown token: not one this node's agent handed out")
        claimed = f"{owner.namespace}/{owner.pod}" if owner.pod else ""
        if request.container and request.container != owner.container:
            return self._refuse("names", f"the token is for container {owner.container!r}, "
                                         f"not {request.container!r}")
        if request.pod and claimed and request.pod != claimed:
            return self._refuse("names", f"the token is for pod {claimed}, not {request.pod}")
        if peer_pid is None or peer_pid <= 0:
            return self._refuse("peer", "the connecting process could not be identified (no SO_PEERCRED)")
        key = (owner.pod_uid, owner.container)
        known = self._processes.get(key, {}).get(peer_pid)
        now = self._clock()
        if known is not None and now - known.last_seen < self.heartbeat_s / 2:
            self.stats.throttled += 1  # the pid cannot be another's: it is alive and connected now
            return RegisterReply(True, renew_s=self.heartbeat_s)
        start = process_start_time(peer_pid, self._proc)
        if start is None:
            return self._refuse("peer", f"process {peer_pid} is gone")
        mismatch = self._cgroup_mismatch(owner, peer_pid)
        if mismatch:
            return self._refuse("cgroup", mismatch)
        table = self._processes.setdefault(key, {})
        if known is not None and known.start_time == start:
            table[peer_pid] = replace(known, renewed_at=now)
            self.stats.renewed += 1
            log.debug("renewed pid %d of %s/%s", peer_pid, claimed or owner.pod_uid, owner.container)
            return RegisterReply(True, renew_s=self.heartbeat_s)
        table[peer_pid] = RegisteredProcess(peer_pid, request.pid, start, now)
        self.stats.accepted += 1
        log.info("registered pid %d (pid %d in its container) of %s/%s", peer_pid, request.pid,
                 claimed or owner.pod_uid, owner.container)
        return RegisterReply(True, renew_s=self.heartbeat_s)

    def _cgroup_mismatch(self, owner: TokenOwner, pid: int) -> str:
        identity = self._cgroup_of(pid)
        if identity.pod_uid and identity.pod_uid != owner.pod_uid:
            return (f"process {pid} runs in pod {identity.pod_uid}, the token is for pod {owner.pod_uid}")
        if identity.container_id and self._directory is not None:
            ref = self._directory.container(identity.container_id)
            if ref is not None and ref.container != owner.container:
                return (f"process {pid} runs in container {ref.container!r}, the token is for "
                        f"{owner.container!r}")
        if not identity.container_id:
            log.debug("pid %d: cgroup names no container (%s); accepted on its token", pid, identity.reason)
        return ""

    def _refuse(self, kind: str, reason: str) -> RegisterReply:
        self.stats.refuse(kind)
        return RegisterReply(False, reason)

    # -------------------------------------------------------------------------------- reading
    def prune(self) -> int:
        """Drop processes that exited (or whose pid now names another process); how many."""
        dropped = 0
        for key, table in list(self._processes.items()):
            for pid, proc in list(table.items()):
                if process_start_time(pid, self._proc) != proc.start_time:
                    del table[pid]
                    dropped += 1
            if not table:
                del self._processes[key]
        return dropped

    def processes(self, pod_uid: str, container: str) -> list[RegisteredProcess]:
        """The live registered processes of one container, oldest registration first."""
        self.prune()
        table = self._processes.get((pod_uid, container), {})
        return sorted(table.values(), key=lambda p: p.registered_at)

    def counts(self) -> dict[tuple[str, str, str], int]:
        """(namespace, pod, container) → live registered processes, for every container with a token
        (a pod not yet named again after a restart shows as its UID with an empty namespace)."""
        self.prune()
        out: dict[tuple[str, str, str], int] = {}
        for (uid, container), token in self._tokens.items():
            owner = self._owners[token]
            key = (owner.namespace, owner.pod or uid, container)
            out[key] = len(self._processes.get((uid, container), {}))
        return out

    def heartbeats(self) -> dict[tuple[str, str, str], Heartbeat]:
        """(namespace, pod, container) → its heartbeat, for every container with a token (named as in
        :meth:`counts`). The age is the stalest live process's: one frozen process of a container
        whose other processes renew is still reported."""
        self.prune()
        now = self._clock()
        out: dict[tuple[str, str, str], Heartbeat] = {}
        for (uid, container), token in self._tokens.items():
            owner = self._owners[token]
            table = self._processes.get((uid, container), {})
            age = max((now - p.last_seen for p in table.values()), default=0.0)
            out[(owner.namespace, owner.pod or uid, container)] = Heartbeat(
                len(table), max(age, 0.0), age > self.stale_after_s)
        return out
