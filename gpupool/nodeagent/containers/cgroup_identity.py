"""Which container and pod a process runs in, read from its cgroup path (``/proc/<pid>/cgroup``).

Kubelet and the runtimes name cgroups in a few known ways (docs/monitor.md has the table):

- cgroupfs driver: ``/kubepods/<qos>/pod<uid>/<id>`` (guaranteed pods sit right under
  ``/kubepods``), CRI-O ``.../pod<uid>/crio-<id>``; containerd without per-QoS cgroups
  ``/k8s.io/<id>``; plain docker ``/docker/<id>``.
- systemd driver: ``/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_with_underscores>.slice/``
  then ``cri-containerd-<id>.scope``, ``crio-<id>.scope`` or ``docker-<id>.scope``.

cgroup v1 lists one line per hierarchy, v2 one ``0::`` line, hybrid both; the v2 line is read
first, then the v1 lines in order, and the first that names a container wins. Anything else gives
an identity with an empty container id and the reason, never an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Runtime(StrEnum):
    """The container runtime a cgroup name reveals."""

    CONTAINERD = "containerd"
    CRIO = "cri-o"
    DOCKER = "docker"
    UNNAMED = "unnamed"
    """A kubelet pod's container whose cgroup is its bare id (cgroupfs driver, containerd or docker)."""
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class CgroupIdentity:
    """What the cgroup path says: runtime, container id, pod UID and QoS class, or why nothing."""

    runtime: Runtime
    container_id: str = ""
    pod_uid: str = ""
    qos: str = ""
    reason: str = ""


_ID = r"[0-9a-f]{64}"
_SCOPE = re.compile(rf"^(cri-containerd|crio|docker)-({_ID})(?:\.scope)?$")
_BARE = re.compile(rf"^{_ID}$")
_POD_CGROUPFS = re.compile(r"^pod([0-9a-f-]{36})$")
# Matched at the end only: a kubelet with a custom --cgroup-root prefixes the slice names.
_POD_SYSTEMD = re.compile(r"(?:^|-)kubepods(?:-(burstable|besteffort))?-pod([0-9a-f_]{36})\.slice$")
_QOS_CLASSES = ("burstable", "besteffort")
_RUNTIME_OF_PREFIX = {"cri-containerd": Runtime.CONTAINERD, "crio": Runtime.CRIO, "docker": Runtime.DOCKER}
_RUNTIME_OF_PARENT = {"k8s.io": Runtime.CONTAINERD, "docker": Runtime.DOCKER}


def identity_from_cgroup_file(text: str) -> CgroupIdentity:
    """Read the content of ``/proc/<pid>/cgroup``."""
    paths: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            paths.insert(0, parts[2])
        else:
            paths.append(parts[2])
    if not paths:
        return CgroupIdentity(Runtime.UNKNOWN, reason="no cgroup lines")
    for path in paths:
        found = identity_from_path(path)
        if found.container_id:
            return found
    return CgroupIdentity(Runtime.UNKNOWN, reason=f"no known container naming in cgroup {paths[0]!r}")


def identity_from_path(path: str) -> CgroupIdentity:
    """Read one cgroup path (the part after the second colon)."""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts) - 1, -1, -1):
        runtime, container_id = _container_of(parts[i], parts[i - 1] if i else "")
        if container_id:
            pod_uid, qos = _pod_of(parts[:i])
            if runtime is Runtime.UNNAMED and not pod_uid:
                continue  # a bare id outside a pod and under no known runtime parent
            return CgroupIdentity(runtime, container_id, pod_uid, qos)
    return CgroupIdentity(Runtime.UNKNOWN, reason=f"no known container naming in cgroup {path!r}")


def _container_of(name: str, parent: str) -> tuple[Runtime, str]:
    scoped = _SCOPE.match(name)
    if scoped:
        return _RUNTIME_OF_PREFIX[scoped.group(1)], scoped.group(2)
    if _BARE.match(name):
        return _RUNTIME_OF_PARENT.get(parent, Runtime.UNNAMED), name
    return Runtime.UNKNOWN, ""


def _pod_of(parents: list[str]) -> tuple[str, str]:
    """Pod UID and QoS class from the components above the container."""
    for i in range(len(parents) - 1, -1, -1):
        name = parents[i]
        systemd = _POD_SYSTEMD.search(name)
        if systemd:
            return systemd.group(2).replace("_", "-"), systemd.group(1) or "guaranteed"
        cgroupfs = _POD_CGROUPFS.match(name)
        if cgroupfs:
            above = parents[i - 1] if i else ""
            return cgroupfs.group(1), above if above in _QOS_CLASSES else "guaranteed"
    return "", ""
