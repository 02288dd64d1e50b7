"""Settings every test shares.

Hypothesis' per-example deadline is a timing assertion: on a shared 2-core CI machine one slow
example fails a property that holds. Speed lives in the benchmarks, so the deadline is off.

Collection caches the compiled test modules even where ``PYTHONDONTWRITEBYTECODE`` is set (as on
our machines): without the cache pytest rewrites the asserts of every test module again in each
run, which was two thirds of collecting the suite (24 s of CPU against 9 s with the cache; the fast
loop and each of scripts/test-all's four pytest processes collect everything). The cache is the
usual ``__pycache__`` (ignored by git), keyed by each source's mtime and size, so an edited module is
always compiled again; the interpreter's setting is restored once collection ends.

The interception library's builds (:mod:`tests.shim.library_fixtures`) are the whole session's, so
that every module that runs the library shares one build of each flavour.
"""

import sys
from collections.abc import Iterator

import pytest
from hypothesis import settings

from gpupool.api.cluster_settings import ClusterSettings
from gpupool.cli import cluster_options
from tests.shim.library_fixtures import plain, sanitized

__all__ = ["plain", "sanitized"]

settings.register_profile("gpupool", deadline=None)
settings.load_profile("gpupool")


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """Let collection write compiled modules, then put the interpreter's setting back."""
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        yield
    finally:
        sys.dont_write_bytecode = saved


@pytest.fixture(autouse=True)
def no_cluster_config_map(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands run in-process (click's runner) resolve the shared settings as with no ConfigMap in
    the cluster: its defaults, flags on top. A test that wants a ConfigMap's values patches
    :func:`cluster_options.read_with_client` itself; commands run as processes (e2e) read the real one."""
    monkeypatch.setattr(cluster_options, "read_with_client", lambda _kubeconfig: lambda _where: ClusterSettings())
