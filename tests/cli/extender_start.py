"""Run ``gpupool extender FLAGS`` up to the point where it would start, and return its options."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpupool.api.cluster_settings import ClusterSettings
from gpupool.cli import cluster_options, extender_cmd
from gpupool.cli.main import cli


def started_with(monkeypatch: pytest.MonkeyPatch, *flags: str,
                 config_map: ClusterSettings | None = None) -> extender_cmd.ExtenderOptions:
    """The options ``gpupool extender`` would run with (the command must accept the flags), with
    ``config_map`` as what the cluster's ConfigMap holds (default: none, the built-in defaults)."""
    started: list[extender_cmd.ExtenderOptions] = []
    monkeypatch.setattr(extender_cmd, "run_extender", started.append)
    monkeypatch.setattr(cluster_options, "read_with_client",
                        lambda _kubeconfig: lambda _where: config_map or ClusterSettings())
    result = CliRunner().invoke(cli, ["extender", *flags])
    assert result.exit_code == 0, result.output
    (options,) = started
    return options
