"""Finding a pod's processes through /proc/<pid>/cgroup."""

from __future__ import annotations

from pathlib import Path

from gpupool.nodeagent.lending.processes import PodProcesses, ProcfsProcesses, namespace_pid

CID = "a" * 64
UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def proc(root: Path, pid: int, cgroup: str, state: str = "S") -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "cgroup").write_text(cgroup)
    (d / "stat").write_text(f"{pid} (sh) {state} 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0\n")


def test_a_pods_processes_by_container_id_and_pod_uid(tmp_path: Path) -> None:
    proc(tmp_path, 10, f"0::/k8s.io/{CID}\n")
    proc(tmp_path, 11, f"0::/kubepods/besteffort/pod{UID}/{'b' * 64}\n")
    proc(tmp_path, 12, "0::/user.slice\n")
    proc(tmp_path, 13, f"0::/k8s.io/{CID}\n", state="Z")  # a zombie holds nothing
    found = ProcfsProcesses(str(tmp_path), skip=()).pids(PodProcesses(UID, frozenset({CID})))
    assert found == {10, 11}


def test_a_containers_process_1_is_told_by_the_last_nspid_field(tmp_path: Path) -> None:
    """A container's first process is 1 in its own pid namespace (the last NSpid field); the agent,
    with hostPID, sees it under its host pid first."""
    for pid, nspid in ((4100, "4100\t1"), (4101, "4101\t7"), (1, "1"), (4102, "")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(f"Name:\tx\nNSpid:\t{nspid}\nPPid:\t0\n")
    control = ProcfsProcesses(str(tmp_path), skip=())
    assert control.inits({4100, 4101, 4102, 4103}) == {4100}  # 4103: gone; 4102: no field
    assert namespace_pid(str(tmp_path), 4101) == 7 and namespace_pid(str(tmp_path), 4103) is None
