"""Host mount points of test nodes: created for the first node, removed after the last one of any
process on the machine (an rmdir of a mount point in another namespace detaches it there, so two
pytest runs side by side must not remove what the other's nodes stand on)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.testenv import mountns


@pytest.fixture
def machine_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    lock = tmp_path / "machine.lock"
    monkeypatch.setattr(mountns, "MACHINE_LOCK", lock)
    yield lock
    assert mountns._machine is None, "a test left this process holding the machine lock"


def other_process_with_a_node(lock: Path) -> subprocess.Popen[bytes]:
    """A process that holds the machine lock shared, as another pytest run with a node does."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT | os.O_APPEND)\n"
        "fcntl.flock(fd, fcntl.LOCK_SH)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    return holder


def test_the_last_node_of_the_machine_removes_the_created_paths(machine_lock: Path, tmp_path: Path) -> None:
    point = tmp_path / "var" / "lib" / "kubelet"
    mountns.claim_mount_points("n1", [point])
    mountns.claim_mount_points("n2", [point])
    assert point.is_dir() and machine_lock.read_text() == f"{point}\n"
    mountns.release_mount_points("n1")
    assert point.is_dir()  # n2 still stands on it
    mountns.release_mount_points("n2")
    assert not point.exists() and machine_lock.read_text() == ""


def test_a_path_another_process_still_needs_stays_until_that_process_is_done(machine_lock: Path,
                                                                           tmp_path: Path) -> None:
    point = tmp_path / "var" / "log" / "pods"
    mountns.claim_mount_points("n1", [point])
    holder = other_process_with_a_node(machine_lock)
    try:
        mountns.release_mount_points("n1")
        assert point.is_dir(), "removed while another process's node stands on it"
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
    # a later last user of the machine removes what this process created, from the lock file's list
    mountns.claim_mount_points("n3", [])
    mountns.release_mount_points("n3")
    assert not point.exists()


def test_a_claim_waits_while_the_last_user_removes_the_paths(machine_lock: Path, tmp_path: Path) -> None:
    point = tmp_path / "run" / "containerd"
    remover = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(machine_lock)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('removing', flush=True)\n"
        "time.sleep(0.3)\n")], stdout=subprocess.PIPE)
    assert remover.stdout is not None and remover.stdout.readline() == b"removing\n"
    began = time.monotonic()
    mountns.claim_mount_points("n1", [point])
    assert time.monotonic() - began >= 0.1 and point.is_dir()
    remover.wait(10)
    mountns.release_mount_points("n1")
    assert not point.exists()
