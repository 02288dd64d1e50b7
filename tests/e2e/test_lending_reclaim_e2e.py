"""Lending end to end in real containers: bench/reclaim.py's cycles as a test.

A containerd kubelet, ``gpupool node-agent --lending``, an owner pod idle on its card, borrowers
bound by hand running ``examples/checkpoint_worker.sh``; the owner's new open reclaims each
borrower (checkpoint signal, eviction) and the next borrower of the same task resumes from the
checkpoint the last one wrote in its mounted directory.
"""

from __future__ import annotations

import pytest

from bench.reclaim import TARGET_S, run
from gpupool.testenv.runtime_tools import runtime_impossible_reason

pytestmark = pytest.mark.e2e


def test_the_owner_gets_its_lent_card_back_and_the_next_borrower_resumes() -> None:
    reason = runtime_impossible_reason()
    if reason is not None:
        pytest.skip(f"real containers cannot run on this machine: {reason}")
    result = run(cycles=2)
    assert result["owner_reclaim_p99_s"] <= TARGET_S, result
    assert result["checkpoints_written"] == 2, result
    assert result["borrowers_resumed"] == 1, result
