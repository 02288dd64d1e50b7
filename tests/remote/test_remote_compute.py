"""A remote client held to its compute share: with --enforce-compute its calls run in a process
under gpupool's interception library with the share as its limit, measured on the stand-in's card
timeline (the busy time NVML reports), so a loaded machine slows the launches without faking the
figure."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpupool.api.remote_gpu import RemoteClient
from tests.remote.remote_support import (
    CARD,
    Programs,
    build_programs,
    busy_percent,
    client,
    probe_env,
    run_probe,
    running_server,
    token,
)

pytestmark = pytest.mark.slow
TOLERANCE = 10.0
#: Kernels of 4 ms and a 20 ms launch queue, as the interception library's own compute tests use.
TIMELINE = {"GPUPOOL_STANDIN_KERNEL_US": "4000", "GPUPOOL_STANDIN_QUEUE_US": "20000"}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return build_programs(tmp_path_factory.mktemp("remote-programs"))


def busy_while_launching(programs: Programs, tmp_path: Path, share: RemoteClient, *extra: str) -> float:
    with running_server(programs, tmp_path, [share], extra=list(extra), card=TIMELINE) as server:
        env = probe_env(programs, f"127.0.0.1:{server.port}", share.token)
        began = time.monotonic_ns()
        out = run_probe(programs, env, "launch_for", "2000")
        ended = time.monotonic_ns()
    assert out.startswith("launched "), out
    return busy_percent(programs, tmp_path / "standin.state", began + 600_000_000, ended)


def test_a_client_is_held_to_its_compute_share(programs: Programs, tmp_path: Path) -> None:
    share = RemoteClient(token("a"), "ns/a", CARD, 256, 30)
    busy = busy_while_launching(programs, tmp_path, share, "--enforce-compute")
    assert abs(busy - 30) <= TOLERANCE, busy


def test_without_enforcement_the_client_fills_the_card(programs: Programs, tmp_path: Path) -> None:
    busy = busy_while_launching(programs, tmp_path, client("a"))
    assert busy >= 60, busy
