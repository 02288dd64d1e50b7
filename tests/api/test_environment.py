"""The container environment contract: what Allocate writes is what the container side reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.api import environment as env
from gpupool.api.environment import CardShare, ContainerEnvironment, EnvContractError

shares = st.builds(CardShare, index=st.integers(0, 15), uuid=st.from_regex(r"GPU-[0-9a-f]{8}", fullmatch=True),
                   memory_mib=st.integers(0, 1 << 20), compute_percent=st.integers(0, 100))


@pytest.mark.slow
@given(cards=st.lists(shares, max_size=8), pod=st.from_regex(r"[a-z]{1,8}/[a-z]{1,8}", fullmatch=True),
       container=st.from_regex(r"[a-z]{1,8}", fullmatch=True))
def test_written_environment_reads_back(cards: list[CardShare], pod: str, container: str) -> None:
    written = ContainerEnvironment(pod, container, tuple(cards))
    assert ContainerEnvironment.from_env(written.to_env()) == written


def test_mps_gets_the_smallest_compute_share_and_no_cap_without_one() -> None:
    two = ContainerEnvironment("ns/p", "c", (CardShare(1, "GPU-b", 4096, 30), CardShare(0, "GPU-a", 2048, 20)))
    assert two.to_env()[env.MPS_THREAD_PERCENTAGE] == "20"
    assert two.to_env()[env.MPS_PINNED_MEMORY] == "0=4096M,1=2048M"
    memory_only = ContainerEnvironment("ns/p", "c", (CardShare(0, "GPU-a", 2048, 0),))
    assert memory_only.to_env()[env.MPS_THREAD_PERCENTAGE] == "100"


def _good() -> dict[str, str]:
    return ContainerEnvironment("ns/p", "c", (CardShare(0, "GPU-a", 2048, 20),)).to_env()


@pytest.mark.parametrize("change, message", [
    pytest.param({env.VERSION: "2"}, "version 1", id="unknown-version"),
    pytest.param({env.VERSION: None}, "version 1", id="no-version"),
    pytest.param({env.POD: None}, "missing GPUPOOL_POD", id="missing-variable"),
    pytest.param({env.MEMORY_LIMIT_MIB: "-5"}, "not a non-negative integer", id="negative-memory"),
    pytest.param({env.MEMORY_LIMIT_MIB: "9" * 40}, "not a non-negative integer", id="huge-memory"),
    pytest.param({env.COMPUTE_PERCENT: "150"}, "above 100", id="compute-over-a-card"),
    pytest.param({env.CARD_UUIDS: "GPU-a,GPU-b"}, "different numbers of cards", id="uneven-lists"),
])
def test_broken_environments_are_refused_with_the_variable_named(change: dict[str, str | None],
                                                                  message: str) -> None:
    broken = _good()
    for key, value in change.items():
        if value is None:
            del broken[key]
        else:
            broken[key] = value
    with pytest.raises(EnvContractError, match=message):
        ContainerEnvironment.from_env(broken)
