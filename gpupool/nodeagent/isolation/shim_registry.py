"""Who may register and who did: tokens handed out, and the processes registered per container.

A registration is accepted when the token is one Allocate handed out, the connecting process (its
pid from ``SO_PEERCRED``, in the agent's pid namespace) still exists, the names it claims are the
token's, and, when its cgroup names a pod or a container the agent knows, those are the token's
too. A process whose cgroup names nothing known (a runtime naming the agent cannot read, or a test
outside any container) is accepted on its token alone; the reply says nothing different, the log
does. Processes are kept as (pid, start time): a pid reused by another process is not mistaken
for the registered one, and dead ones are pruned whenever the table is read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpupool.api.shim_contract import RegisterReply, RegisterRequest
from gpupool.nodeagent.monitor.cgroup_identity import CgroupIdentity
from gpupool.nodeagent.monitor.container_directory import ContainerDirectory
from gpupool.nodeagent.monitor.procfs import PROC, process_start_time

log = logging.getLogger(__name__)

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
    """One registered process: host pid, the pid it reported (its own namespace's), start time."""

    pid: int
    reported_pid: int
    start_time: int
    registered_at: float


@dataclass
class RegistryStats:
    """Counters for metrics: accepted registrations and refusals by reason class."""

    accepted: int = 0
    refused: dict[str, int] = field(default_factory=dict)

    def refuse(self, kind: str) -> None:
        self.refused[kind] = self.refused.get(kind, 0) + 1


CgroupReader = Callable[[int], CgroupIdentity]


class ShimRegistry:
    """Tokens handed out and the processes that registered with them."""

    def __init__(self, cgroup_of: CgroupReader, directory: ContainerDirectory | None = None,
                 proc: str = PROC, clock: Callable[[], float] = time.time) -> None:
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
        start = process_start_time(peer_pid, self._proc)
        if start is None:
            return self._refuse("peer", f"process {peer_pid} is gone")
        mismatch = self._cgroup_mismatch(owner, peer_pid)
        if mismatch:
            return self._refuse("cgroup", mismatch)
        key = (owner.pod_uid, owner.container)
        table = self._processes.setdefault(key, {})
        table[peer_pid] = RegisteredProcess(peer_pid, request.pid, start, self._clock())
        self.stats.accepted += 1
        log.info("registered pid %d (pid %d in its container) of %s/%s", peer_pid, request.pid,
                 claimed or owner.pod_uid, owner.container)
        return RegisterReply(True)

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
