"""PID → the pod container it runs in: its cgroup path, then the container directory.

The recorder's identity resolver. It never raises: a process outside any container, of an unknown
runtime or of a container the directory does not (yet) know is recorded with what is known (maybe
only the container ID) and the reason is logged once per container ID.
"""

from __future__ import annotations

import logging

from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime, identity_from_cgroup_file
from gpupool.nodeagent.containers.container_directory import ContainerDirectory
from gpupool.nodeagent.linux.procfs import PROC
from gpupool.nodeagent.monitor.usage_state import ProcessIdentity

log = logging.getLogger(__name__)

_REPORTED_LIMIT = 10_000  # forget what was logged past this many keys (a long-lived agent's memory)


class ContainerResolver:
    """Callable ``pid → ProcessIdentity`` for :class:`~gpupool.nodeagent.monitor.recorder.UsageRecorder`."""

    def __init__(self, directory: ContainerDirectory, proc: str = PROC) -> None:
        self._directory = directory
        self._proc = proc
        self._reported: set[str] = set()

    def cgroup_identity(self, pid: int) -> CgroupIdentity:
        """What ``/proc/<pid>/cgroup`` says."""
        try:
            with open(f"{self._proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
                return identity_from_cgroup_file(fh.read())
        except OSError as exc:
            return CgroupIdentity(Runtime.UNKNOWN, reason=f"cannot read /proc/{pid}/cgroup: {exc.strerror}")

    def __call__(self, pid: int) -> ProcessIdentity:
        """The container, pod and namespace of ``pid``, as far as they are known."""
        found = self.cgroup_identity(pid)
        if not found.container_id:
            self._report_once(found.reason, f"pid {pid}: not in a known container ({found.reason})")
            return ProcessIdentity()
        ref = self._directory.container(found.container_id)
        if ref is not None:
            return ProcessIdentity(found.container_id, ref.container, ref.pod, ref.namespace)
        pod = self._directory.pod(found.pod_uid) if found.pod_uid else None
        self._report_once(found.container_id, f"pid {pid}: container {found.container_id[:12]} "
                          f"({found.runtime}) is not in the container directory"
                          + (f"; pod {pod[0]}/{pod[1]}" if pod else ""))
        if pod is not None:
            return ProcessIdentity(found.container_id, "", pod[1], pod[0])
        return ProcessIdentity(found.container_id)

    def _report_once(self, key: str, message: str) -> None:
        if key not in self._reported:
            if len(self._reported) >= _REPORTED_LIMIT:
                self._reported.clear()
            self._reported.add(key)
            log.info("%s", message)
