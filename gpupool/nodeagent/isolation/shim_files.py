"""The host side of the interception library's mounts, under the agent's state directory.

::

    <state>/shim-secret                       the token secret (0600; never mounted)
    <state>/shim/ld.so.preload                one line naming the library in the container
    <state>/shim/libgpupool-shim.so           the library, copied here at start (see below)
    <state>/agent-socket/agent.sock           the registration socket (its directory is mounted)
    <state>/containers/<pod-uid>_<container>/ one per container with a share (mounted read-write)

A per-container directory is keyed by pod UID and container name, neither of which may contain
``_`` (a UID is hex and dashes in practice, opaque by contract, so any UID without ``_``, ``/`` or a
leading dot is taken; a container name is a DNS label), so the name splits back unambiguously.
The library is copied under the state directory because the path ``gpupool shim path`` prints is
a path in the agent's own filesystem, which on a DaemonSet is the agent's image, not the host the
container runtime bind-mounts from; the state directory is a host path seen at the same place. A
changed library replaces the copy atomically: running containers keep the inode they mounted.

Only that container mounts it, so it may be writable by any user in the container
(the library's first process creates the accounting region there); the ``containers`` directory
above it is root-only, so nobody else on the host reaches it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
from dataclasses import dataclass

from gpupool.api.shim_contract import AGENT_SOCKET_NAME, PRELOAD_LINE, TOKEN_FILE

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = "/var/lib/gpupool"
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,127}$")  # UUIDs in practice; never "_", "/" or ".."
_CONTAINER = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_CONTAINER_DIR_MODE = 0o777  # the container's user may be anyone; only that container mounts it


class ShimFileError(OSError):
    """A file the mounts need could not be made; Allocate is refused with this message."""


@dataclass(frozen=True)
class ShimLayout:
    """Where the agent keeps each host path of the library's mounts."""

    state_dir: str

    @property
    def secret(self) -> str:
        return os.path.join(self.state_dir, "shim-secret")

    @property
    def preload(self) -> str:
        return os.path.join(self.state_dir, "shim", "ld.so.preload")

    @property
    def library(self) -> str:
        return os.path.join(self.state_dir, "shim", "libgpupool-shim.so")

    @property
    def socket_dir(self) -> str:
        return os.path.join(self.state_dir, "agent-socket")

    @property
    def socket(self) -> str:
        return os.path.join(self.socket_dir, AGENT_SOCKET_NAME)

    @property
    def containers(self) -> str:
        return os.path.join(self.state_dir, "containers")

    def container_dir(self, pod_uid: str, container: str) -> str:
        """The directory of one container; a UID or name that cannot be one is refused."""
        if not _UID.match(pod_uid) or not _CONTAINER.match(container):
            raise ShimFileError(f"pod UID {pod_uid!r} / container {container!r} cannot name a directory")
        return os.path.join(self.containers, f"{pod_uid}_{container}")


def parse_container_dir(name: str) -> tuple[str, str] | None:
    """(pod UID, container) of a directory name, or ``None`` for a name the agent did not make."""
    uid, sep, container = name.partition("_")
    if not sep or not _UID.match(uid) or not _CONTAINER.match(container):
        return None
    return uid, container


def prepare_node(layout: ShimLayout) -> None:
    """Create the directories and the preload file (idempotent; called once at start)."""
    os.makedirs(layout.state_dir, mode=0o755, exist_ok=True)
    os.makedirs(layout.containers, mode=0o700, exist_ok=True)
    os.makedirs(layout.socket_dir, mode=0o755, exist_ok=True)
    os.makedirs(os.path.dirname(layout.preload), mode=0o755, exist_ok=True)
    write_if_changed(layout.preload, PRELOAD_LINE, 0o644)


def install_library(layout: ShimLayout, source: str) -> str:
    """Copy the library to its host path under the state directory (unless it is there already)."""
    target = layout.library
    with open(source, "rb") as fh:
        data = fh.read()
    with contextlib.suppress(OSError), open(target, "rb") as fh:
        if fh.read() == data:
            return target
    tmp = f"{target}.{secrets.token_hex(8)}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def write_if_changed(path: str, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` unless it holds it already; atomically (a reader never sees half)."""
    with contextlib.suppress(OSError), open(path, encoding="utf-8") as fh:
        if fh.read() == text:
            return
    tmp = f"{path}.{secrets.token_hex(8)}.tmp"  # unique per writer, thread or process
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def prepare_container(layout: ShimLayout, pod_uid: str, container: str, token: str) -> str:
    """The container's directory with its token file; the same result however often it is called."""
    path = layout.container_dir(pod_uid, container)
    try:
        os.makedirs(path, exist_ok=True)
        os.chmod(path, _CONTAINER_DIR_MODE)
        write_if_changed(os.path.join(path, TOKEN_FILE), token + "\n", 0o644)
    except OSError as exc:
        raise ShimFileError(f"cannot prepare {path}: {exc.strerror or exc}") from None
    return path


def existing_containers(layout: ShimLayout) -> list[tuple[str, str]]:
    """(pod UID, container) of every per-container directory on disk."""
    try:
        names = os.listdir(layout.containers)
    except OSError:
        return []
    return [parsed for parsed in map(parse_container_dir, sorted(names)) if parsed is not None]


def remove_container(layout: ShimLayout, pod_uid: str, container: str) -> None:
    """Remove one container's directory and what the library left in it."""
    path = layout.container_dir(pod_uid, container)
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
        log.warning("could not remove %s", path)
