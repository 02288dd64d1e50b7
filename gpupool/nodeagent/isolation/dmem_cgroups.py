"""The cgroupfs side of ``dmem`` limits: where a pod's containers are, and writing ``dmem.max``.

A container's cgroup is found by walking the cgroup v2 tree once per pass and reading each
directory's name the way the usage monitor reads ``/proc/<pid>/cgroup``
(:func:`~gpupool.nodeagent.containers.cgroup_identity.identity_from_path`): the runtime's container id,
and the pod UID when kubelet's hierarchy names it. The container directory (fed from the pods'
statuses) turns the id into the container's name. No process of the container has to be running
or registered, so the limit is in place before its first CUDA call when the pass comes first.

Writing a limit follows cgroup v2's rules: a cgroup has ``dmem.max`` only when its parent enables
``dmem`` in ``cgroup.subtree_control``, which in turn needs it enabled all the way from the root;
kubelet and systemd enable only the controllers they know. So every ancestor from the root down to
the container's parent gets ``+dmem`` (idempotent), then ``<region> <bytes>`` goes to the
container's ``dmem.max`` (one region per write, as the kernel's parser prefers) and is read back.
Files are opened without ``O_CREAT``: a file the kernel did not make is an error, never created.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from gpupool.nodeagent.containers.cgroup_identity import identity_from_path

DMEM_MAX = "dmem.max"
SUBTREE_CONTROL = "cgroup.subtree_control"
CONTROLLER = "dmem"
MAX_DEPTH = 8
"""Deepest cgroup looked at below the root: kubelet's systemd layout puts containers at depth 4."""


class DmemWriteError(OSError):
    """A limit could not be written; the message names the file and the reason."""


@dataclass(frozen=True)
class CgroupContainer:
    """A container's cgroup directory, as its name gives it."""

    path: str
    container_id: str
    pod_uid: str


def container_cgroups(root: str, max_depth: int = MAX_DEPTH) -> Iterator[CgroupContainer]:
    """Every directory under ``root`` whose name is a container's (unreadable parts are skipped:
    cgroups come and go while the walk runs)."""
    stack = [(root, 0)]
    while stack:
        directory, depth = stack.pop()
        try:
            entries = [e for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for entry in entries:
            found = identity_from_path(os.path.relpath(entry.path, root))
            # The container's own directory names it; one below it (``<id>/init``) is not it.
            if found.container_id and found.container_id in entry.name:
                yield CgroupContainer(entry.path, found.container_id, found.pod_uid)
            elif depth + 1 < max_depth:
                stack.append((entry.path, depth + 1))


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _write(path: str, text: str) -> None:
    """One ``write`` of ``text`` to an existing file (O_TRUNC as a shell's ``>`` does)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def enable_controller(root: str, cgroup: str) -> None:
    """``+dmem`` in ``cgroup.subtree_control`` of the root and every ancestor of ``cgroup`` below it."""
    relative = os.path.relpath(os.path.dirname(cgroup), root)
    parts = [] if relative == "." else relative.split(os.sep)
    for depth in range(len(parts) + 1):
        directory = os.path.join(root, *parts[:depth])
        control = os.path.join(directory, SUBTREE_CONTROL)
        try:
            if CONTROLLER in _read(control).split():
                continue
            _write(control, f"+{CONTROLLER}\n")
        except OSError as exc:
            raise DmemWriteError(f"cannot enable dmem in {control}: {exc.strerror or exc}") from None


def read_limits(cgroup: str) -> dict[str, str]:
    """``dmem.max`` of ``cgroup``: region → value as written (bytes or ``max``)."""
    limits = {}
    for line in _read(os.path.join(cgroup, DMEM_MAX)).splitlines():
        parts = line.split()
        if len(parts) == 2:
            limits[parts[0]] = parts[1]
    return limits


def write_limit(root: str, cgroup: str, region: str, limit_bytes: int) -> None:
    """Cap ``cgroup``'s use of ``region`` at ``limit_bytes`` (controller enabled above it first)."""
    enable_controller(root, cgroup)
    path = os.path.join(cgroup, DMEM_MAX)
    if not os.path.exists(path):
        raise DmemWriteError(f"{path} does not exist: the kernel did not enable dmem for this cgroup")
    try:
        _write(path, f"{region} {limit_bytes}\n")
        kept = read_limits(cgroup).get(region)
    except OSError as exc:
        raise DmemWriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    if kept != str(limit_bytes):
        raise DmemWriteError(f"{path} reads {region} {kept or '(absent)'} after writing {limit_bytes}")
