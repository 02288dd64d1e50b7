"""The container gate's bookkeeping over a recording stand-in of the kernel's gate: the union of the
deciders, containers without a process yet, failures, and finding a container's cgroup in /proc."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.nodeagent.containers.container_gate import ContainerGate, find_container_cgroup
from gpupool.nodeagent.linux.cgroup_device_gate import GateError

CID_A, CID_B = "a" * 64, "b" * 64


class RecordingGate:
    """What the kernel's gate was told, per (cgroup, device); ``fail`` makes deny raise."""

    def __init__(self) -> None:
        self.denied: set[tuple[str, str]] = set()
        self.calls: list[tuple[str, str, str]] = []
        self.fail = False
        self.closed = False

    def deny(self, cgroup: str, device: str) -> None:
        self.calls.append(("deny", cgroup, device))
        if self.fail:
            raise GateError("no cgroup2 directory (has the container exited?)")
        self.denied.add((cgroup, device))

    def allow(self, cgroup: str, device: str) -> None:
        self.calls.append(("allow", cgroup, device))
        self.denied.discard((cgroup, device))

    def close(self) -> None:
        self.closed = True
        self.denied.clear()


def test_a_file_stays_refused_while_any_decider_wants_it() -> None:
    kernel = RecordingGate()
    gate = ContainerGate(kernel, {CID_A: "/k8s.io/a", CID_B: "/k8s.io/b"}.get)
    gate.set("lending", {CID_A: ["/dev/nvidia0"]})
    gate.set("risk", {CID_A: ["/dev/nvidia0", "/dev/nvidia1"], CID_B: ["/dev/nvidia1"]})
    assert kernel.denied == {("/k8s.io/a", "/dev/nvidia0"), ("/k8s.io/a", "/dev/nvidia1"),
                             ("/k8s.io/b", "/dev/nvidia1")}
    gate.set("risk", {})
    assert kernel.denied == {("/k8s.io/a", "/dev/nvidia0")}, "the lending rules still refuse it"
    assert gate.refused() == {CID_A: frozenset({"/dev/nvidia0"})}
    gate.set("lending", {})
    assert kernel.denied == set() and gate.refused() == {}
    assert gate.stats.denied == 3 and gate.stats.allowed == 3
    gate.close()
    assert kernel.closed


def test_a_container_without_a_process_is_refused_once_one_runs() -> None:
    kernel = RecordingGate()
    cgroups: dict[str, str] = {}
    gate = ContainerGate(kernel, cgroups.get)
    gate.set("lending", {CID_A: ["/dev/nvidia0"]})
    assert kernel.denied == set() and gate.refused() == {}
    cgroups[CID_A] = "/k8s.io/a"
    gate.set("lending", {CID_A: ["/dev/nvidia0"]})
    assert kernel.denied == {("/k8s.io/a", "/dev/nvidia0")}


def test_a_failing_deny_is_logged_and_tried_again_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    kernel = RecordingGate()
    kernel.fail = True
    gate = ContainerGate(kernel, {CID_A: "/k8s.io/a"}.get)
    gate.set("lending", {CID_A: ["/dev/nvidia0"]})
    assert gate.refused() == {} and gate.stats.failures == 1
    assert "cannot refuse /dev/nvidia0" in caplog.text
    kernel.fail = False
    gate.set("lending", {CID_A: ["/dev/nvidia0"]})
    assert gate.refused() == {CID_A: frozenset({"/dev/nvidia0"})}


def test_find_container_cgroup_reads_the_v2_line_of_a_process_of_the_container(tmp_path: Path) -> None:
    for pid, text in ((7, "0::/system.slice/x\n"), (8, f"5:devices:/k8s.io/{CID_A}\n0::/k8s.io/{CID_A}\n")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    assert find_container_cgroup(CID_A, str(tmp_path)) == f"/k8s.io/{CID_A}"
    assert find_container_cgroup(CID_B, str(tmp_path)) is None
