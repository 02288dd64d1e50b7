"""Who may register: token, names, a live peer, its cgroup; and the table of registered processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.api.shim_contract import RegisterRequest
from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry

UID = "0f3c9a2e-1b7d-4c1e-9a55-3f2b8c7d6e10"
OTHER_UID = "9f3c9a2e-1b7d-4c1e-9a55-3f2b8c7d6e10"
TOKEN = "ab" * 32
CID = "c" * 64
OTHER_CID = "d" * 64


class FakeProc:
    """A /proc with just ``<pid>/stat`` (start time in field 22)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def start(self, pid: int, start_time: int) -> None:
        (self.root / str(pid)).mkdir(exist_ok=True)
        fields = ["S", *["0"] * 18, str(start_time), "0"]
        (self.root / str(pid) / "stat").write_text(f"{pid} (python (x)) {' '.join(fields)}\n")

    def end(self, pid: int) -> None:
        (self.root / str(pid) / "stat").unlink()
        (self.root / str(pid)).rmdir()


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


def registry(proc: FakeProc, cgroups: dict[int, CgroupIdentity] | None = None) -> ShimRegistry:
    directory = InMemoryContainerDirectory()
    directory.add(UID, "ns", "p", {"main": f"containerd://{CID}", "side": f"containerd://{OTHER_CID}"})
    found = cgroups or {}
    reg = ShimRegistry(lambda pid: found.get(pid, CgroupIdentity(Runtime.UNKNOWN, reason="none")), directory,
                       str(proc.root), clock=lambda: 100.0)
    reg.issue(TOKEN, UID, "main", "ns", "p")
    return reg


def request(token: str = TOKEN, pod: str = "ns/p", container: str = "main") -> RegisterRequest:
    return RegisterRequest(token, 7, pod, container)


def test_a_live_process_with_its_token_is_recorded(proc: FakeProc) -> None:
    proc.start(1234, 555)
    reg = registry(proc, {1234: CgroupIdentity(Runtime.CONTAINERD, CID, UID, "burstable")})
    reply = reg.register(request(), 1234)
    assert reply.ok, reply.reason
    [entry] = reg.processes(UID, "main")
    assert (entry.pid, entry.reported_pid, entry.start_time, entry.registered_at) == (1234, 7, 555, 100.0)
    assert reg.counts() == {("ns", "p", "main"): 1}
    assert reg.stats.accepted == 1


@pytest.mark.parametrize(("req", "peer", "cgroup", "reason", "kind"), [
    pytest.param(request(token="cd" * 32), 1234, None, "unknown token", "token", id="unknown-token"),
    pytest.param(request(container="side"), 1234, None, "the token is for container 'main', not 'side'",
                 "names", id="other-container-claimed"),
    pytest.param(request(pod="ns/q"), 1234, None, "the token is for pod ns/p, not ns/q", "names",
                 id="other-pod-claimed"),
    pytest.param(request(), None, None, "no SO_PEERCRED", "peer", id="peer-unknown"),
    pytest.param(request(), 4321, None, "process 4321 is gone", "peer", id="peer-gone"),
    pytest.param(request(), 1234, CgroupIdentity(Runtime.CONTAINERD, "e" * 64, OTHER_UID),
                 f"runs in pod {OTHER_UID}, the token is for pod {UID}", "cgroup", id="cgroup-of-another-pod"),
    pytest.param(request(), 1234, CgroupIdentity(Runtime.CONTAINERD, OTHER_CID, UID),
                 "runs in container 'side', the token is for 'main'", "cgroup", id="cgroup-of-another-container"),
])
def test_refusals_say_why(proc: FakeProc, req: RegisterRequest, peer: int | None, cgroup: CgroupIdentity | None,
                          reason: str, kind: str) -> None:
    proc.start(1234, 555)
    reg = registry(proc, {1234: cgroup} if cgroup else None)
    reply = reg.register(req, peer)
    assert not reply.ok and reason in reply.reason
    assert reg.stats.refused == {kind: 1}
    assert reg.processes(UID, "main") == []


def test_a_process_outside_any_known_container_is_accepted_on_its_token(proc: FakeProc) -> None:
    """Contract: the cgroup is checked *when resolvable*; a runtime naming the agent cannot read
    must not lock a container out of registration."""
    proc.start(1234, 555)
    assert registry(proc).register(request(), 1234).ok


def test_a_container_the_directory_does_not_know_yet_is_accepted_when_the_pod_matches(proc: FakeProc) -> None:
    proc.start(1234, 555)
    reg = registry(proc, {1234: CgroupIdentity(Runtime.CONTAINERD, "f" * 64, UID)})
    assert reg.register(request(), 1234).ok


def test_dead_and_reused_pids_are_pruned(proc: FakeProc) -> None:
    reg = registry(proc)
    for pid in (10, 11, 12):
        proc.start(pid, 100 + pid)
        assert reg.register(request(), pid).ok
    assert reg.counts() == {("ns", "p", "main"): 3}
    proc.end(10)
    proc.start(11, 999)  # pid 11 now names another process
    assert [p.pid for p in reg.processes(UID, "main")] == [12]
    proc.end(12)
    assert reg.prune() == 1
    assert reg.counts() == {("ns", "p", "main"): 0}


def test_a_token_known_by_uid_only_gets_its_pod_names_later(proc: FakeProc) -> None:
    """After an agent restart the tokens come back from the directories on disk (UID and container
    only); registration works at once and the names are filled in when the pod is listed."""
    proc.start(1234, 555)
    reg = ShimRegistry(lambda pid: CgroupIdentity(Runtime.UNKNOWN), None, str(proc.root))
    reg.issue(TOKEN, UID, "main")
    assert reg.register(request(), 1234).ok
    assert reg.counts() == {("", UID, "main"): 1}
    reg.name_pods({UID: ("ns", "p")})
    assert reg.counts() == {("ns", "p", "main"): 1}


def test_forget_drops_token_and_processes(proc: FakeProc) -> None:
    proc.start(1234, 555)
    reg = registry(proc)
    assert reg.register(request(), 1234).ok
    reg.forget((UID, "main"))
    assert reg.owner(TOKEN) is None and reg.counts() == {}
    assert not reg.register(request(), 1234).ok
