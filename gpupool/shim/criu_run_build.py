"""Build ``criu-run``, the entrypoint wrapper that dumps a workload with CRIU on the checkpoint signal
and restores it from such a dump at its next start (``src/criu_run/criu_run.c``; docs/lending.md,
"Process checkpoints with CRIU").

It is linked statically: it runs inside the workload's container, whatever C library the image has
(a busybox image has none). Built like the interception library, from the shipped source on the
node, cached under a digest of the compiler, its flags and the source.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from gpupool.shim.build import DIGEST_LENGTH, SOURCE_DIR, _compile, cache_dir, find_compiler

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
    _compile(compiler, list(flags), [SOURCE], output, link_flags=(), hint="a static build needs libc6-dev's libc.a")
    return output
