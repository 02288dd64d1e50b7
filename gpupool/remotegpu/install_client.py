"""``gpupool remote-gpu install-client``: the init container the pod-scheduler webhook gives a pod
asking for a remote share (:mod:`gpupool.extender.remote_injection`).

It runs on the pod's node after the bind, so it knows what the webhook could not: whether the share
was booked on another node's card (the pod's ``remote-share-v1``, handed in by the downward API) or
on the pod's own node (none: a local share, the node's driver serves it, nothing is installed).
For a remote share it copies the GPU client (``libcuda.so.1``) into the pod's volume that the GPU
container preloads, then waits until the grant Secret's endpoint and token are in the mounted
directory, so the GPU container never starts without them (the Secret volume is optional, kubelet
fills it in when the GPU node's agent has written it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from gpupool.files.replace import replace_file

CLIENT_NAME = "libcuda.so.1"
GRANT_KEYS = ("remote_endpoint", "remote_token")
DEFAULT_WAIT_S = 600.0
POLL_S = 0.5


class InstallError(RuntimeError):
    """The grant did not come in time (the init container fails with the reason)."""


def copy_client(source: Path, into: Path) -> Path:
    """Copy the GPU client into ``into`` as ``libcuda.so.1`` (written beside, then renamed: a
    program never loads half a library), mode 0755."""
    into.mkdir(parents=True, exist_ok=True)
    replace_file(into / CLIENT_NAME, source.read_bytes(), mode=0o755)
    return into / CLIENT_NAME


def grant_ready(grant: Path) -> bool:
    """Whether the mounted grant holds a non-empty endpoint and token."""
    try:
        return all((grant / key).read_text().strip() for key in GRANT_KEYS)
    except OSError:
        return False


def install_client(share: str, source: Path, into: Path, grant: Path, *, wait_s: float = DEFAULT_WAIT_S,
                   poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> str:
    """Do the module docstring's work; returns what was done in words, raises :class:`InstallError`
    when the grant is still missing after ``wait_s``."""
    if not share.strip():
        return ("the share is on this node's own card (no remote-share-v1): nothing installed, "
                "the node's driver serves it")
    installed = copy_client(source, into)
    deadline = clock() + wait_s
    while not grant_ready(grant):
        if clock() >= deadline:
            raise InstallError(f"no remote_endpoint and remote_token in {grant} after {wait_s:g} s: the GPU node's "
                               "agent writes them in the Secret <pod>-gpupool-remote (is it running with "
                               "--remote-gpu-server?)")
        sleep(poll_s)
    return f"installed the GPU client as {installed}; the grant is in {grant}"
