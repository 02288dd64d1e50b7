"""``--steer-claim-pods`` sends claim pods to gpupool's scheduler, whose extender chooses their node
from its claim watch: refused without the watch (``--dra-claims``, the extender could not read the
claims) or the webhook's port (nothing would steer the pods)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpupool.cli.main import cli


@pytest.mark.parametrize("flags", [
    pytest.param(["--steer-claim-pods"], id="alone"),
    pytest.param(["--steer-claim-pods", "--dra-claims"], id="no-admission-port"),
])
def test_claim_steering_without_the_claim_watch_or_the_webhook_is_a_usage_error(flags: list[str]) -> None:
    result = CliRunner().invoke(cli, ["extender", *flags])
    assert result.exit_code == 2 and "--steer-claim-pods needs --dra-claims" in result.output
