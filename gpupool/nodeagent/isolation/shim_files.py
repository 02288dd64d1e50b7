"""The host side of the interception library's mounts, under the agent's state directory.

::

    <state>/shim-secret                       the token secret (0600; never mounted)
    <state>/shim/ld.so.preload                one line naming the library in the container
    <state>/shim/libgpupool-shim.so           the library, copied here at start (see below)
    <state>/agent-socket/agent.sock           the registration socket (its directory is mounted)
    <state>/containers/<pod-uid>_<container>/ one per container with a share (0755, root's):
        grant          what the node grants it (0644), the library's limits
        token          its registration token (0644)
        memory.region  its accounting region (0666), created here at its full size

A per-container directory is keyed by pod UID and container name, neither of which may contain
``_`` (a UID is hex and dashes in practice, opaque by contract, so any UID without ``_``, ``/`` or a
leading dot is taken; a container name is a DNS label), so the name splits back unambiguously.
The library is copied under the state directory because the path ``gpupool shim path`` prints is
a path in the agent's own filesystem, which on a DaemonSet is the agent's image, not the host the
container runtime bind-mounts from; the state directory is a host path seen at the same place. A
changed library replaces the copy atomically: running containers keep the inode they mounted.

Only that container mounts it: the directory read-only (so nothing in it can be deleted, replaced
or rewritten from inside, the grant included), and the region file alone read-write, as a mount of
its own (a mount point cannot be unlinked or renamed over), because every process of the
container writes its account there. The ``containers`` directory above is root-only, so nobody
else on the host reaches them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from dataclasses import dataclass

from gpupool.api.shim_contract import AGENT_SOCKET_NAME, GRANT_FILE, PRELOAD_LINE, REGION_FILE, TOKEN_FILE
from gpupool.files.replace import replace_file
from gpupool.shim.region import SIZE as REGION_BYTES

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = "/var/lib/gpupool"
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,127}$")  # UUIDs in practice; never "_", "/" or ".."
_CONTAINER = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_CONTAINER_DIR_MODE = 0o755  # mounted read-only; only the region file in it is writable (its own mount)
_REGION_MODE = 0o666  # the container's user may be anyone; only that container mounts it


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
    replace_file(target, data, mode=0o755)
    return target


def write_if_changed(path: str, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` unless it holds it already; atomically (a reader never sees half)."""
    with contextlib.suppress(OSError), open(path, encoding="utf-8") as fh:
        if fh.read() == text:
            return
    replace_file(path, text, mode=mode)


def prepare_container(layout: ShimLayout, pod_uid: str, container: str, token: str, grant: str) -> str:
    """The container's directory with its token, grant and region; the same result however often
    it is called (an existing region is never touched: it holds the container's account)."""
    path = layout.container_dir(pod_uid, container)
    try:
        os.makedirs(path, exist_ok=True)
        os.chmod(path, _CONTAINER_DIR_MODE)
        write_if_changed(os.path.join(path, TOKEN_FILE), token + "\n", 0o644)
        write_if_changed(os.path.join(path, GRANT_FILE), grant, 0o644)
        create_region(os.path.join(path, REGION_FILE))
    except OSError as exc:
        raise ShimFileError(f"cannot prepare {path}: {exc.strerror or exc}") from None
    return path


def create_region(path: str) -> None:
    """Create an empty region file of the library's size unless one exists. The library
    initialises a zero-filled file; under a grant it never creates one itself (the container's
    copy is a bind mount of this file, and a file it could create it could also delete)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _REGION_MODE)
    except FileExistsError:
        os.chmod(path, _REGION_MODE)
        return
    try:
        os.ftruncate(fd, REGION_BYTES)
        os.fchmod(fd, _REGION_MODE)  # past the umask
    finally:
        os.close(fd)


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
