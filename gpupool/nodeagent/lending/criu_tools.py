"""The programs a pod that asks for process checkpoints gets mounted: ``criu-run``, CRIU and CRIU's
kernel cache (docs/lending.md, "Process checkpoints with CRIU").

With ``--criu PATH`` (a statically linked CRIU 4: it runs inside the workload's container, whatever
the image) the agent fills one host directory at start, which every grant of a pod annotated
``gpupool.io/checkpoint: process`` mounts read-only at :data:`CRIU_MOUNT`:

- ``criu``: a copy of PATH (a later change of PATH does not reach running pods' mounts);
- ``criu-run``: the wrapper, built from the shipped source (:mod:`gpupool.shim.criu_run_build`);
- ``criu.kdat``: CRIU's probe of the kernel, written by ``criu check --unprivileged`` with
  ``XDG_RUNTIME_DIR`` naming the directory. CRIU keeps it only on a tmpfs (the default directory,
  under ``/run``, is one), and with it a container needs only ``CAP_CHECKPOINT_RESTORE``; without
  it CRIU probes the kernel itself, which needs ``CAP_SYS_ADMIN`` too. The start logs which.
- ``cuda-checkpoint``: a copy of NVIDIA's tool where the agent found one (on its ``PATH`` at start,
  as for its own stage before a kill), which ``criu-run`` finds beside CRIU and runs around the dump
  so CUDA processes can be dumped. NVIDIA ships a small binary linked against ``libc.so.6`` and
  ``libcuda.so.1``: it runs in a container with glibc and the driver's library (a GPU pod under the
  NVIDIA runtime has that one), not in a musl or busybox image. Copied, not mounted from the host,
  so the directory is one self-contained mount and the host's tool changes what pods call only at
  the agent's next start; a directory of an earlier start whose tool is gone loses its copy.

Nothing here raises: a directory that cannot be filled leaves process checkpoints off, with the log.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from gpupool.shim.build import ShimBuildError
from gpupool.shim.criu_run_build import PROGRAM as CRIU_RUN
from gpupool.shim.criu_run_build import build_criu_run

log = logging.getLogger(__name__)

CRIU_MOUNT = "/var/run/gpupool/criu"
"""Where the directory appears in a container: its command is ``/var/run/gpupool/criu/criu-run -- ...``."""
CRIU_ENV = "GPUPOOL_CRIU"
"""Names the CRIU binary for ``criu-run``."""
KERNEL_CACHE = "criu.kdat"
CUDA_CHECKPOINT = "cuda-checkpoint"
CHECK_TIMEOUT_S = 60.0


def _install(source: str, target: Path) -> None:
    """Copy ``source`` to ``target`` (executable) through a temporary name: a running pod never sees half."""
    copy = target.with_name(f".{target.name}.copy")
    shutil.copyfile(source, copy)
    copy.chmod(0o755)
    copy.replace(target)


def prepare_criu_tools(criu: str, directory: str, cuda_checkpoint: str | None = None) -> str | None:
    """Fill ``directory`` with CRIU, ``criu-run``, CRIU's kernel cache and (when given) a copy of
    ``cuda-checkpoint``; the directory, or ``None`` (logged) when CRIU or the wrapper cannot be put there."""
    target = Path(directory)
    try:
        target.mkdir(mode=0o755, parents=True, exist_ok=True)
        _install(criu, target / "criu")
        build_criu_run(target / CRIU_RUN)
    except (OSError, ShimBuildError) as exc:
        log.error("process checkpoints are off: cannot put CRIU (%s) and criu-run in %s: %s", criu, directory, exc)
        return None
    _put_cuda_checkpoint(cuda_checkpoint, target)
    cache = target / KERNEL_CACHE
    cache.unlink(missing_ok=True)  # a cache from another kernel (a directory that outlived a reboot)
    try:
        done = subprocess.run([str(target / "criu"), "check", "--unprivileged"], capture_output=True, text=True,
                              env={**os.environ, "XDG_RUNTIME_DIR": str(target)}, timeout=CHECK_TIMEOUT_S,
                              check=False)
        said = (done.stdout + done.stderr).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    except (OSError, subprocess.TimeoutExpired) as exc:
        said = [str(exc)]
    if cache.is_file():
        log.info("process checkpoints: CRIU and criu-run in %s with CRIU's kernel cache: a container under "
                 "criu-run needs the CHECKPOINT_RESTORE capability", directory)
    else:
        log.warning("process checkpoints: CRIU and criu-run in %s, but `criu check` wrote no kernel cache there "
                    "(%s; CRIU keeps it only on a tmpfs): a container under criu-run needs SYS_ADMIN as well as "
                    "CHECKPOINT_RESTORE", directory, said[0])
    return directory


def _put_cuda_checkpoint(tool: str | None, target: Path) -> None:
    """The copy of ``cuda-checkpoint`` criu-run runs around its dumps (none: CUDA processes cannot be dumped)."""
    if tool is not None:
        try:
            _install(tool, target / CUDA_CHECKPOINT)
            log.info("process checkpoints: cuda-checkpoint (%s) in %s: criu-run suspends a pod's CUDA processes "
                     "around its dump (needs glibc and libcuda.so.1 in the container)", tool, target)
            return
        except OSError as exc:
            log.warning("process checkpoints: cannot copy cuda-checkpoint (%s) into %s: %s", tool, target, exc)
    else:
        log.info("process checkpoints: no cuda-checkpoint on the agent's PATH: a process that uses the GPU cannot "
                 "be dumped (criu-run passes the signal on instead)")
    (target / CUDA_CHECKPOINT).unlink(missing_ok=True)  # an earlier start's copy
