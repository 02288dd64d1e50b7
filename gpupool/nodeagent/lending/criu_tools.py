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
CHECK_TIMEOUT_S = 60.0


def prepare_criu_tools(criu: str, directory: str) -> str | None:
    """Fill ``directory`` with CRIU, ``criu-run`` and CRIU's kernel cache; the directory, or ``None``
    (logged) when CRIU or the wrapper cannot be put there."""
    target = Path(directory)
    try:
        target.mkdir(mode=0o755, parents=True, exist_ok=True)
        copy = target / ".criu.copy"
        shutil.copyfile(criu, copy)
        copy.chmod(0o755)
        copy.replace(target / "criu")
        build_criu_run(target / CRIU_RUN)
    except (OSError, ShimBuildError) as exc:
        log.error("process checkpoints are off: cannot put CRIU (%s) and criu-run in %s: %s", criu, directory, exc)
        return None
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
