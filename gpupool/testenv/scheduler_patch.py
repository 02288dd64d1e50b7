"""kube-scheduler v1.20.2 with the upstream fix that makes it call an extender's ``preemptVerb``.

Why a second kube-scheduler: v1.20.0 to v1.20.9 (and v1.21.0 to v1.21.3) never call any
extender's preempt verb. ``pkg/scheduler/factory.go`` (``Configurator.create``) builds the
scheduling framework without ``frameworkruntime.WithExtenders(extenders)``, so
``PreemptHandle().Extenders()`` is empty and ``defaultpreemption.CallExtenders`` returns
kube-scheduler's own candidates untouched (kubernetes/kubernetes#102971, fixed by #103019, in
v1.20.10 by the cherry-pick #103030, in v1.21.4 and v1.22.0). Debian's source package holds v1.20.2,
so the test environment adds that one line, the whole upstream fix, to a separate binary: the
end-to-end preemption tests run the scheduler every fixed release behaves like, and every other
test keeps the stock v1.20.2 binary.

The tree is patched, compiled and restored under the build lock, so a later build of the stock
binaries never sees the patch.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpupool.testenv import build
from gpupool.testenv.errors import BuildFailedError
from gpupool.testenv.paths import bin_dir, cache_dir

#: The upstream pull request whose change this binary carries (named in the binary's file name).
UPSTREAM_FIX = "103030"

#: The file the fix changes, relative to the Kubernetes tree.
FACTORY = Path("pkg/scheduler/factory.go")

#: The option line of ``profile.NewMap`` after which the fix adds its own.
ANCHOR = "\t\tframeworkruntime.WithPodNominator(nominator),\n"

#: The line the fix adds: the profiles' frameworks get the extenders, so preemption can ask them.
FIX = "\t\tframeworkruntime.WithExtenders(extenders),\n"


def preempting_scheduler_path() -> Path:
    """Where the patched binary lives (``<cache>/bin/kube-scheduler-pr103030``)."""
    return bin_dir() / f"kube-scheduler-pr{UPSTREAM_FIX}"


def patched_source(text: str) -> str:
    """``factory.go`` with the fix applied; raises if the anchor is not there exactly once (another
    tree than v1.20.2's) or the fix is already in (then there is nothing to build here)."""
    if FIX in text:
        raise BuildFailedError(f"{FACTORY} already passes the extenders to the framework")
    if text.count(ANCHOR) != 1:
        raise BuildFailedError(f"{FACTORY}: the profile.NewMap options are not where v1.20.2 has them")
    return text.replace(ANCHOR, ANCHOR + FIX)


def ensure_preempting_scheduler(log: build.Log = build.quiet) -> Path:
    """The patched kube-scheduler, compiled first if the cache lacks it (needs the stock binaries'
    tree: call :func:`gpupool.testenv.build.ensure_binaries` first)."""
    target = preempting_scheduler_path()
    if target.is_file() and os.access(target, os.X_OK):
        return target
    root = cache_dir()
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    tree = build.source_tree(log)
    with build.exclusive_lock(root / ".build.lock", log):
        if target.is_file():
            return target
        factory = tree / FACTORY
        original = factory.read_text()
        factory.write_text(patched_source(original))
        try:
            build.patch_vendor(tree)
            log(f"compiling kube-scheduler with upstream #{UPSTREAM_FIX} (log: {logs / 'make-scheduler.log'})")
            build.run_step(["make", "WHAT=cmd/kube-scheduler"], logs / "make-scheduler.log", cwd=tree,
                           env=build.go_env(tree), failure=BuildFailedError, step="make (patched kube-scheduler)")
            bin_dir().mkdir(parents=True, exist_ok=True)
            build.install(tree / "_output" / "bin" / "kube-scheduler", target)
        finally:
            factory.write_text(original)
            # the stock build copies _output/bin/kube-scheduler: never leave the patched one there
            (tree / "_output" / "bin" / "kube-scheduler").unlink(missing_ok=True)
    return target
