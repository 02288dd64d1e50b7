"""PID → the pod container it runs in: its cgroup path, then the container directory.

The recorder's identity resolver. It never raises: a process outside any container, of an unknown
runtime or of a container the directory does not (yet) know is recorded with what is known (maybe
only the container ID) and the reason is logged once per container ID.

A process in no pod whose executable (the basename of the /proc/<pid>/exe link: set by the kernel at
exec, unlike /proc/<pid>/comm, which a process may rename) is one of the named infrastructure holders
is marked as such. Only a process whose cgroup names no container and no pod (nothing under
``kubepods``) qualifies: a process in a tenant's container cannot claim to be a host daemon by its
binary's name, and a pod's container whose cgroup naming the agent does not know stays an unnamed
holder (it blocks lending, as before).

A process of a pod is infrastructure only by its pod: the pod runs in one of the namespaces the admin
named (``--infrastructure-namespaces``: where GPU infrastructure runs as DaemonSets, e.g. the GPU
Operator's DCGM exporter and driver container) and asked for no GPU at all: none of gpupool's and
none of another device plugin's (``nvidia.com/gpu`` of NVIDIA's plugin, ``amd.com/gpu``:
:mod:`~gpupool.nodeagent.gpu_resources`). Its mark is the namespace. A pod that booked a share, or
asked another plugin for a card, stays an ordinary holder (its limits, ownership and the risk checks
apply), and a pod the container directory does not know yet is not judged (it is asked again once it
is; before the pod watch's first list the recorder keeps such holders undecided:
:mod:`~gpupool.nodeagent.monitor.pod_list_wait`). Each pod so judged is logged once.
"""

from __future__ import annotations

import logging
import os

from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime, identity_from_cgroup_file
from gpupool.nodeagent.containers.container_directory import ContainerDirectory
from gpupool.nodeagent.linux.procfs import PROC
from gpupool.nodeagent.monitor.usage_state import ProcessIdentity

log = logging.getLogger(__name__)

_REPORTED_LIMIT = 10_000  # forget what was logged past this many keys (a long-lived agent's memory)


class ContainerResolver:
    """Callable ``pid → ProcessIdentity`` for :class:`~gpupool.nodeagent.monitor.recorder.UsageRecorder`."""

    def __init__(self, directory: ContainerDirectory, proc: str = PROC, *,
                 infrastructure: frozenset[str] = frozenset(),
                 infrastructure_namespaces: frozenset[str] = frozenset()) -> None:
        self._directory = directory
        self._proc = proc
        self._infrastructure = infrastructure
        self._namespaces = infrastructure_namespaces
        self._reported: set[str] = set()

    def cgroup_identity(self, pid: int) -> CgroupIdentity:
        """What ``/proc/<pid>/cgroup`` says."""
        return self._cgroup(pid)[0]

    def _cgroup(self, pid: int) -> tuple[CgroupIdentity, str]:
        try:
            with open(f"{self._proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            return CgroupIdentity(Runtime.UNKNOWN, reason=f"cannot read /proc/{pid}/cgroup: {exc.strerror}"), ""
        return identity_from_cgroup_file(text), text

    def __call__(self, pid: int) -> ProcessIdentity:
        """The container, pod and namespace of ``pid``, as far as they are known."""
        found, text = self._cgroup(pid)
        if not found.container_id:
            if self._infrastructure and text and not found.pod_uid and "kubepods" not in text:
                name = self.executable(pid)
                if name in self._infrastructure:
                    return ProcessIdentity(infrastructure=name)
            self._report_once(found.reason, f"pid {pid}: not in a known container ({found.reason})")
            return ProcessIdentity()
        ref = self._directory.container(found.container_id)
        if ref is not None:
            uid = found.pod_uid or self._directory.pod_uid(found.container_id)
            return ProcessIdentity(found.container_id, ref.container, ref.pod, ref.namespace,
                                   self._pod_infrastructure(pid, uid, ref.namespace, ref.pod))
        pod = self._directory.pod(found.pod_uid) if found.pod_uid else None
        self._report_once(found.container_id, f"pid {pid}: container {found.container_id[:12]} "
                          f"({found.runtime}) is not in the container directory"
                          + (f"; pod {pod[0]}/{pod[1]}" if pod else ""))
        if pod is not None:
            return ProcessIdentity(found.container_id, "", pod[1], pod[0],
                                   self._pod_infrastructure(pid, found.pod_uid, *pod))
        return ProcessIdentity(found.container_id)

    def _pod_infrastructure(self, pid: int, pod_uid: str, namespace: str, pod: str) -> str:
        """The namespace when the pod is infrastructure (listed namespace, no GPU asked for), else ""."""
        if namespace not in self._namespaces or not pod_uid or self._directory.asks_gpus(pod_uid):
            return ""
        self._report_once(f"infrastructure {pod_uid}",
                          f"pod {namespace}/{pod} (pid {pid}, {self.executable(pid) or '?'}) asked for no GPU and "
                          f"runs in the infrastructure namespace {namespace}: its open device files are "
                          "infrastructure, not use (--infrastructure-namespaces)")
        return namespace

    def executable(self, pid: int) -> str:
        """The basename of the file ``pid`` runs (its /proc/<pid>/exe link); "" when unreadable."""
        try:
            target = os.readlink(f"{self._proc}/{pid}/exe")
        except OSError:
            return ""
        return os.path.basename(target.removesuffix(" (deleted)"))  # a binary replaced by an upgrade

    def _report_once(self, key: str, message: str) -> None:
        if key not in self._reported:
            if len(self._reported) >= _REPORTED_LIMIT:
                self._reported.clear()
            self._reported.add(key)
            log.info("%s", message)
