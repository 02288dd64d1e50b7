"""The checkpoint protocol (claim 6): a per-task directory, its environment, and resuming from it.

Every container with a gpupool share gets ``GPUPOOL_CHECKPOINT_DIR`` (a host directory per task,
mounted read-write at :data:`~gpupool.api.lending.CHECKPOINT_MOUNT`), the signal and the deadline
it has to write a checkpoint before it is ended. The task is the pod's ``checkpoint-key``
annotation, else its controller's UID, else ``namespace/name``: a Job's or ReplicaSet's next pod
finds the checkpoints of the one that was reclaimed. Nothing in a task's path names the node, so
where ``--checkpoint-dir`` is a mount every node shares (NFS, CephFS) the next pod finds them on
any node. The path is ``<root>/<namespace>/<task>``: a key is only ever looked up within the pod's
own namespace, so no annotation can name another tenant's task, and the root and namespace
directories are the agent's alone (mode 0700; the container sees only its task's directory). When
the directory holds a checkpoint that passes the checks of
:mod:`~gpupool.nodeagent.lending.checkpoint_files`, the newest is named in ``GPUPOOL_RESUME_FROM``.

NVIDIA's ``cuda-checkpoint`` (driver 550+) suspends a process's CUDA state into host memory; where
the binary is found, a reclaim runs it on the processes that outlive the deadline before they are
killed (:mod:`gpupool.nodeagent.lending.cuda_suspend`). The agent dumps no process itself: a workload
under ``criu-run`` (``gpupool/shim/src/criu_run``) dumps its own processes with CRIU into
``criu-<n>`` of its directory, which :func:`newest_checkpoint` accepts; with ``--criu`` the grant of a
pod annotated ``checkpoint: process`` mounts CRIU and the wrapper (docs/lending.md).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable

from gpupool.api import lending as contract
from gpupool.nodeagent.isolation.backends import Enforcement as EnforcementPort
from gpupool.nodeagent.isolation.backends import EnforcementState, LivePods
from gpupool.nodeagent.lending.checkpoint_files import newest_checkpoint
from gpupool.nodeagent.lending.criu_tools import CRIU_ENV, CRIU_MOUNT
from gpupool.nodeagent.lending.pods import LendingPod
from gpupool.nodeagent.types import GrantExtras, Mount, PodView

log = logging.getLogger(__name__)

CUDA_CHECKPOINT = "cuda-checkpoint"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_NAME_LIMIT = 60
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
PRIVATE_MODE = 0o700
"""The root and the namespace directories: only the agent (root) lists or enters them."""
TASK_MODE = 0o777
"""A task's directory: whatever user the task's containers run as may write its checkpoints (only
that task's containers have it mounted; its parent keeps everyone else out)."""


def find_cuda_checkpoint(which: Callable[[str], str | None] = shutil.which) -> str | None:
    """The path of NVIDIA's ``cuda-checkpoint`` when the node has it."""
    return which(CUDA_CHECKPOINT)


def task_dir_name(key: str) -> str:
    """A directory name for a checkpoint key: readable, and unique by a hash of the whole key."""
    readable = _UNSAFE.sub("_", key).strip("._")[:_NAME_LIMIT] or "task"
    return f"{readable}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def namespace_dir_name(namespace: str) -> str:
    """A namespace's directory: its name (a DNS label); anything else is hashed, never shared."""
    return namespace if _NAMESPACE.match(namespace) else f"_{task_dir_name(namespace)}"


def _own_dir(path: str, mode: int) -> None:
    """Create ``path`` with ``mode`` (exact, whatever the umask), or narrow an existing one to it."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if os.path.islink(path) or not os.path.isdir(path):
            raise NotADirectoryError(f"{path} is not a directory") from None
        if os.stat(path).st_mode & 0o7777 == mode:
            return
    os.chmod(path, mode)


class CheckpointStore:
    """The per-task directories under ``root`` (a hostPath, e.g. ``/var/lib/gpupool/checkpoint``;
    a mount every node shares for checkpoints that move with their task)."""

    def __init__(self, root: str, deadline_s: float = contract.DEFAULT_CHECKPOINT_DEADLINE_S) -> None:
        self.root = root
        self.deadline_s = deadline_s
        self.lock = threading.Lock()
        """Held while a directory is handed out, and by the retention sweep while it moves one aside
        or removes an empty namespace directory (:mod:`~gpupool.nodeagent.lending.checkpoint_retention`)."""

    def directory(self, namespace: str, key: str) -> str:
        """The host directory of task ``key`` of ``namespace`` (created, with its parents' modes), its
        modification time set to now: the task is live, for every agent's retention sweep."""
        parent = os.path.join(self.root, namespace_dir_name(namespace))
        path = os.path.join(parent, task_dir_name(key))
        with self.lock:
            try:
                self._make(parent, path)
            except FileNotFoundError:  # another node's sweep removed the namespace directory it emptied
                self._make(parent, path)
        return path

    def _make(self, parent: str, path: str) -> None:
        os.makedirs(self.root, mode=PRIVATE_MODE, exist_ok=True)
        _own_dir(parent, PRIVATE_MODE)
        _own_dir(path, TASK_MODE)
        os.utime(path, follow_symlinks=False)

    @staticmethod
    def newest(directory: str) -> str | None:
        """The name of the newest checkpoint in ``directory`` fit to resume from, if any."""
        return newest_checkpoint(directory)

    def extras(self, namespace: str, key: str) -> GrantExtras:
        """The protocol's environment and mount for a container of task ``key`` in ``namespace``."""
        host = self.directory(namespace, key)
        env = {contract.CHECKPOINT_DIR_ENV: contract.CHECKPOINT_MOUNT,
               contract.CHECKPOINT_SIGNAL_ENV: contract.CHECKPOINT_SIGNAL,
               contract.CHECKPOINT_DEADLINE_ENV: f"{self.deadline_s:g}"}
        newest = self.newest(host)
        if newest is not None:
            env[contract.RESUME_FROM_ENV] = f"{contract.CHECKPOINT_MOUNT}/{newest}"
        return GrantExtras(envs=env, mounts=(Mount(host, contract.CHECKPOINT_MOUNT, read_only=False),))


class CheckpointEnforcement:
    """The node's enforcement backend with the checkpoint protocol added to every grant."""

    def __init__(self, inner: EnforcementPort, store: CheckpointStore,
                 pod_of: Callable[[tuple[str, str]], LendingPod | None], criu_tools: str | None = None) -> None:
        self._inner = inner
        self._store = store
        self._pod_of = pod_of
        self._criu_tools = criu_tools
        """The host directory with CRIU and ``criu-run`` (:mod:`~gpupool.nodeagent.lending.criu_tools`);
        mounted for pods annotated ``checkpoint: process``. ``None``: the agent was given no ``--criu``."""
        self.registry = getattr(inner, "registry", None)  # the library's registrations, for the report
        self.granted: Callable[[tuple[str, str], str], None] | None = None
        """Told of each grant once the backend made it (the container's region exists, it has not
        started): the lending service's :meth:`~gpupool.nodeagent.lending.service.LendingService.owner_granted`."""

    def grant_extras(self, pod: PodView, container: str) -> GrantExtras:
        """The backend's extras plus the protocol's (the backend's variables win a clash)."""
        base = self._inner.grant_extras(pod, container)
        if self.granted is not None:
            self.granted(pod.key, container)
        known = self._pod_of(pod.key)
        if known is None:  # the pod cache hands every pod it grants from to the lending side first
            log.warning("pod %s/%s is unknown to the lending side: its checkpoint directory is keyed by "
                        "namespace/name, not by its checkpoint-key or controller", pod.namespace, pod.name)
        key = known.checkpoint_key if known is not None else f"{pod.namespace}/{pod.name}"
        try:
            ours = self._store.extras(pod.namespace, key)
        except OSError as exc:  # no checkpoint directory: the grant goes on without the protocol
            log.error("no checkpoint directory for %s/%s: %s", pod.namespace, pod.name, exc)
            return base
        if known is not None and known.process_checkpoint:
            if self._criu_tools is None:
                log.warning("pod %s/%s asks for process checkpoints but the agent has no --criu: nothing is "
                            "mounted at %s", pod.namespace, pod.name, CRIU_MOUNT)
            else:
                ours = GrantExtras(envs={**ours.envs, CRIU_ENV: f"{CRIU_MOUNT}/criu"},
                                   mounts=(*ours.mounts, Mount(self._criu_tools, CRIU_MOUNT, read_only=True)))
        return GrantExtras(envs={**ours.envs, **base.envs}, mounts=(*base.mounts, *ours.mounts))

    def state(self) -> EnforcementState:
        return self._inner.state()

    async def run(self, live_pods: LivePods) -> None:
        await self._inner.run(live_pods)
