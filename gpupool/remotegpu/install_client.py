"""``gpupool remote-gpu install-client``: the init container the pod-scheduler webhook gives a pod
asking for a remote share (:mod:`gpupool.extender.remote_injection`).

It runs on the pod's node after the bind, so it knows what the webhook could not: whether the share
was booked on another node's card (the pod's ``remote-share-v1``, handed in by the downward API) or
on the pod's own node (none: a local share, the node's driver serves it).
For a local share it puts the local-share placeholder, an empty shared object, where the client,
gpupool's CUDA runtime, its cuBLAS and its cuBLASLt would be: the webhook's ``LD_PRELOAD`` names the four paths
whatever the
share turns out to be, and a path naming no file makes the dynamic loader print "cannot be
preloaded" at every program start. The placeholder defines nothing, so the program's
``libcuda.so.1`` is still the node's driver (or the interception library the node's
``/etc/ld.so.preload`` loads in front of it) and its ``libcudart.so.12``, ``libcublas.so.12`` and
``libcublasLt.so.12`` NVIDIA's. For a remote share it copies the GPU client (``libcuda.so.1``), gpupool's CUDA runtime
(``libcudart.so.12``, which a program on the CUDA runtime needs: NVIDIA's cannot start on the
client), gpupool's cuBLAS (``libcublas.so.12``, which forwards cuBLAS calls to the GPU server:
NVIDIA's cannot run on the client either) and gpupool's cuBLASLt (``libcublasLt.so.12``, which
refuses cuBLASLt's matmul calls: NVIDIA's would crash the program) into the pod's
volume that the GPU container preloads, then waits until the grant Secret's endpoint and token are
in the mounted directory, so the GPU container never starts without them (the Secret volume is
optional, kubelet fills it in when the GPU node's agent has written it). Preloaded, gpupool's
runtime, cuBLAS and cuBLASLt answer a program's ``libcudart.so.12``, ``libcublas.so.12`` and
``libcublasLt.so.12`` whatever copy the
program's RPATH or RUNPATH names (a Python wheel's, say).

With ``check_server_name`` (the extender signs GPU nodes' own certificates) it also writes the
share's server node beside the client (``remote_server_name``): the client then requires the
server's certificate to name that node, so a certificate of another node, or a grant Secret pointing
at another node, is refused. The name comes from the pod's own annotation, which the extender
wrote, never from the grant Secret, which the serving node's agent writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from gpupool.api.remote_share import decode_remote_share
from gpupool.files.replace import replace_file

CLIENT_NAME = "libcuda.so.1"
RUNTIME_NAME = "libcudart.so.12"
"""gpupool's CUDA runtime, beside the client in the client's directory and in the pod's."""
BLAS_NAME = "libcublas.so.12"
"""gpupool's cuBLAS, beside the client in the client's directory and in the pod's."""
BLAS_LT_NAME = "libcublasLt.so.12"
"""gpupool's cuBLASLt, beside the client in the client's directory and in the pod's."""
SERVER_NAME_FILE = "remote_server_name"
"""Beside the client: the GPU node its certificate must name (read by the client library)."""
GRANT_KEYS = ("remote_endpoint", "remote_token")
DEFAULT_WAIT_S = 600.0
POLL_S = 0.5


class InstallError(RuntimeError):
    """The grant did not come in time (the init container fails with the reason)."""


def copy_client(source: Path, into: Path, name: str = CLIENT_NAME) -> Path:
    """Copy a library into ``into`` as ``name`` (written beside, then renamed: a program never
    loads half a library), mode 0755."""
    into.mkdir(parents=True, exist_ok=True)
    replace_file(into / name, source.read_bytes(), mode=0o755)
    return into / name


def grant_ready(grant: Path) -> bool:
    """Whether the mounted grant holds a non-empty endpoint and token."""
    try:
        return all((grant / key).read_text().strip() for key in GRANT_KEYS)
    except OSError:
        return False


def install_placeholder(placeholder: Path | None, into: Path) -> str:
    """The local share's work: the placeholder at the client's path. Never fails the pod (the share
    works without it, only the loader's line comes back): a missing placeholder or a failed copy
    is said in words."""
    local = "the share is on this node's own card (no remote-share-v1), the node's driver serves it"
    if placeholder is None:
        return f"{local}; no local-share placeholder in this image, nothing installed"
    try:
        names = (CLIENT_NAME, RUNTIME_NAME, BLAS_NAME, BLAS_LT_NAME)
        installed = [copy_client(placeholder, into, name) for name in names]
    except OSError as exc:
        return f"{local}; the local-share placeholder could not be installed ({exc})"
    return f"{local}; installed the local-share placeholder (loads nothing) as {' and '.join(map(str, installed))}"


def install_runtime(source: Path, into: Path, placeholder: Path | None) -> str:
    """gpupool's CUDA runtime from beside the client ``source``; an image built before it had one
    gets the placeholder there (the program then keeps NVIDIA's runtime, as before)."""
    return install_beside(source, into, placeholder, RUNTIME_NAME, "CUDA runtime")


def install_blas(source: Path, into: Path, placeholder: Path | None) -> str:
    """gpupool's cuBLAS from beside the client ``source``, as :func:`install_runtime` does."""
    return install_beside(source, into, placeholder, BLAS_NAME, "cuBLAS")


def install_blas_lt(source: Path, into: Path, placeholder: Path | None) -> str:
    """gpupool's cuBLASLt from beside the client ``source``, as :func:`install_runtime` does."""
    return install_beside(source, into, placeholder, BLAS_LT_NAME, "cuBLASLt")


def install_beside(source: Path, into: Path, placeholder: Path | None, name: str, what: str) -> str:
    """A library of gpupool's named ``name`` from beside the client ``source``; the placeholder in
    its place when the image has none."""
    library = source.parent / name
    if library.is_file():
        return f"gpupool's {what} as {copy_client(library, into, name)}"
    if placeholder is not None:
        return f"no {what} beside the client, the placeholder as {copy_client(placeholder, into, name)}"
    return f"no {what} beside the client at {library}"


def install_client(share: str, source: Path, into: Path, grant: Path, *, wait_s: float = DEFAULT_WAIT_S,
                   poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep, check_server_name: bool = False,
                   placeholder: Path | None = None) -> str:
    """Do the module docstring's work; returns what was done in words, raises :class:`InstallError`
    when the grant is still missing after ``wait_s``. ``placeholder`` is the local-share
    placeholder (None: none to install)."""
    if not share.strip():
        return install_placeholder(placeholder, into)
    installed = copy_client(source, into)
    runtime = install_runtime(source, into, placeholder)
    blas = install_blas(source, into, placeholder)
    blas_lt = install_blas_lt(source, into, placeholder)
    if check_server_name:
        try:
            server = decode_remote_share(share).server
        except ValueError as exc:
            raise InstallError(f"the pod's remote-share-v1 cannot be read ({exc}): its server's name is "
                               "unknown") from None
        replace_file(into / SERVER_NAME_FILE, f"{server}\n".encode(), mode=0o644)
    deadline = clock() + wait_s
    while not grant_ready(grant):
        if clock() >= deadline:
            raise InstallError(f"no remote_endpoint and remote_token in {grant} after {wait_s:g} s: the GPU node's "
                               "agent writes them in the Secret <pod>-gpupool-remote (is it running with "
                               "--remote-gpu-server?)")
        sleep(poll_s)
    return f"installed the GPU client as {installed}, {runtime}, {blas} and {blas_lt}; the grant is in {grant}"
