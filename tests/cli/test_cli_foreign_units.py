"""The flags that say how foreign names are read: ``--hami`` and ``--gpushare-memory-unit``."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpupool.api.cluster_settings import ClusterSettings
from gpupool.api.names import ResourceNames
from gpupool.cli.extender_cmd import ExtenderOptions
from gpupool.cli.main import cli


@pytest.mark.parametrize(("options", "names"), [
    pytest.param(ExtenderOptions(), ResourceNames(), id="defaults"),
    pytest.param(ExtenderOptions(cluster=ClusterSettings(hami=True)), ResourceNames(hami=True), id="hami"),
    pytest.param(ExtenderOptions(cluster=ClusterSettings(gpushare_memory_unit="MiB")),
                 ResourceNames(gpushare_unit_mib=1), id="gpushare-mib"),
])
def test_extender_options_give_the_names_it_reads_pods_with(options: ExtenderOptions, names: ResourceNames) -> None:
    assert options.resource_names() == names


@pytest.mark.parametrize("command", ["extender", "node-agent"])
def test_a_unit_gpushare_never_used_is_refused(command: str) -> None:
    result = CliRunner().invoke(cli, [command, "--gpushare-memory-unit", "KiB"])
    assert result.exit_code == 2 and "KiB" in result.output
