"""The command-line tests run the commands without a cluster: no ConfigMap is read."""

from __future__ import annotations

import pytest

from gpupool.api.cluster_settings import ClusterSettings
from gpupool.cli import cluster_options


@pytest.fixture(autouse=True)
def no_cluster_config_map(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared settings resolve as with no ConfigMap in the cluster (its defaults, flags on top);
    a test that wants a ConfigMap's values patches :func:`cluster_options.read_with_client` itself."""
    monkeypatch.setattr(cluster_options, "read_with_client", lambda _kubeconfig: lambda _where: ClusterSettings())
