"""Infrastructure holders on the real /proc (issues 26/27): a host process whose executable is a copy of
``sleep`` named ``nvidia-persistenced`` holds one stand-in card, a plain ``sleep`` the other; the
recorder's scan marks only the first, and only the second's card is held."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.nodeagent.containers.cgroup_identity import identity_from_cgroup_file
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.linux.watched_files import WatchedFiles
from gpupool.nodeagent.monitor.container_resolver import ContainerResolver
from gpupool.nodeagent.monitor.process_table import ProcfsTable
from gpupool.nodeagent.monitor.recorder import UsageRecorder
from gpupool.nodeagent.monitor.service import DEFAULT_INFRASTRUCTURE_HOLDERS
from gpupool.nodeagent.monitor.state_file import StateFile
from gpupool.nodeagent.monitor.usage_state import DeviceState
from tests.nodeagent.monitor.children import WAIT_SECONDS, stand_in


def _in_a_pod() -> bool:
    text = Path("/proc/self/cgroup").read_text()
    return bool(identity_from_cgroup_file(text).container_id) or "kubepods" in text


def _holding(executable: str, device: str) -> subprocess.Popen[bytes]:
    """``executable 60`` with ``device`` open as fd 3 (bash opens it, then execs the program)."""
    child = subprocess.Popen(["bash", "-c", f'exec 3<"{device}"; exec "{executable}" 60'])
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            if os.readlink(f"/proc/{child.pid}/exe") == executable:
                return child
        except OSError:
            pass
        time.sleep(0.01)
    child.kill()
    raise AssertionError(f"pid {child.pid} did not exec {executable}")


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        child.kill()
        child.wait()


def test_a_host_daemon_named_by_its_exe_is_marked_and_leaves_its_card_free(
        tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    if _in_a_pod():
        pytest.skip("the test process runs in a container: its children are no host processes")
    sleep = shutil.which("sleep")
    assert sleep is not None
    daemon = tmp_path / "bin" / "nvidia-persistenced"
    daemon.parent.mkdir()
    shutil.copy(os.path.realpath(sleep), daemon)
    devices = [stand_in(str(tmp_path), f"nvidia{i}") for i in range(2)]
    children.append(_holding(str(daemon), devices[0]))
    children.append(_holding(os.path.realpath(sleep), devices[1]))
    resolver = ContainerResolver(InMemoryContainerDirectory(), infrastructure=frozenset(DEFAULT_INFRASTRUCTURE_HOLDERS))
    recorder = UsageRecorder("n1", devices, StateFile(tmp_path / "state.json"), ProcfsTable(WatchedFiles(devices)),
                             identify=resolver)
    recorder.restore()  # finds both by scanning /proc
    infra, user = (recorder.state.device(d) for d in devices)
    assert infra is not None and user is not None
    assert [(h.pid, h.infrastructure) for h in infra.holders] == [(children[0].pid, "nvidia-persistenced")]
    assert [(h.pid, h.infrastructure) for h in user.holders] == [(children[1].pid, "")]
    assert (infra.state, user.state) == (DeviceState.FREE, DeviceState.BUSY)
