"""Build ``criu-run``, the entrypoint wrapper that dumps a workload with CRIU on the checkpoint signal
and restores it from such a dump at its next start (``src/criu_run/criu_run.c``; docs/lending.md,
"Process checkpoints with CRIU").

It is linked statically: it runs inside the workload's container, whatever C library the image has
(a busybox image has none). Built like the interception library, from the shipped source on the
node, cached under a digest of the compiler, its flags and the source.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

from gpupool.shim.build import COMPILE_TIMEOUT_S, DIGEST_LENGTH, SOURCE_DIR, ShimBuildError, cache_dir, find_compiler

SOURCE = SOURCE_DIR / "criu_run" / "criu_run.c"
FLAGS = ("-std=gnu11", "-O2", "-Wall", "-Wextra", "-static")
PROGRAM = "criu-run"


def build_criu_run(output: Path | None = None, *, werror: bool = False) -> Path:
    """Build the wrapper and return its path; without ``output`` a cached build is reused."""
    compiler = find_compiler()
    flags = (*FLAGS, *(("-Werror",) if werror else ()))
    if output is None:
        digest = hashlib.sha256("\0".join([*compiler, *flags]).encode() + SOURCE.read_bytes()).hexdigest()
        output = cache_dir() / f"{PROGRAM}-{digest[:DIGEST_LENGTH]}" / PROGRAM
        if output.is_file():
            return output
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    os.close(fd)
    command = [*compiler, *flags, "-o", temporary, str(SOURCE)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        Path(temporary).unlink(missing_ok=True)
        raise ShimBuildError(f"running {compiler[0]} failed: {exc}") from exc
    if done.returncode != 0:
        Path(temporary).unlink(missing_ok=True)
        raise ShimBuildError(f"{shlex.join(command)} failed (a static build needs libc6-dev's libc.a):\n"
                             f"{done.stderr[-4000:]}")
    os.chmod(temporary, 0o755)
    os.replace(temporary, output)
    return output
