"""``--scheduler-name``: the scheduler the pod-scheduler webhook gives GPU pods must be gpupool's
own; the default scheduler (or none) would send them where no extender is called."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpupool.cli.extender_cmd import ExtenderOptions
from gpupool.cli.main import cli
from gpupool.extender.scheduler_steering import GPUPOOL_SCHEDULER


@pytest.mark.parametrize("name", ["", "default-scheduler"])
def test_the_default_scheduler_is_a_usage_error(name: str) -> None:
    result = CliRunner().invoke(cli, ["extender", f"--scheduler-name={name}"])
    assert result.exit_code == 2 and "--scheduler-name must name gpupool's own scheduler" in result.output


def test_the_default_is_the_profile_the_deployment_runs() -> None:
    assert ExtenderOptions().scheduler_name == GPUPOOL_SCHEDULER == "gpupool-scheduler"
