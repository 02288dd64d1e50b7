"""cgroup path → container: every naming of the drivers, cgroup versions and runtimes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime, identity_from_cgroup_file
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.monitor.container_resolver import ContainerResolver
from gpupool.nodeagent.monitor.usage_state import ProcessIdentity

CID = "7f3c2b1a" * 8
UID = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
UID_ = UID.replace("-", "_")


def _v1(path: str) -> str:
    """A cgroup v1 file whose hierarchies all have ``path`` (and a root v2 line, as on hybrid hosts)."""
    return "".join(f"{i}:{c}:{path}\n" for i, c in enumerate(["cpu,cpuacct", "memory", "name=systemd"], 2)) \
        + "0::/\n"


@pytest.mark.parametrize("content, expected", [
    pytest.param(_v1(f"/kubepods/burstable/pod{UID}/{CID}"),
                 CgroupIdentity(Runtime.UNNAMED, CID, UID, "burstable"), id="cgroupfs-v1-burstable"),
    pytest.param(_v1(f"/kubepods/besteffort/pod{UID}/{CID}"),
                 CgroupIdentity(Runtime.UNNAMED, CID, UID, "besteffort"), id="cgroupfs-v1-besteffort"),
    pytest.param(_v1(f"/kubepods/pod{UID}/{CID}"),
                 CgroupIdentity(Runtime.UNNAMED, CID, UID, "guaranteed"), id="cgroupfs-v1-guaranteed"),
    pytest.param(f"0::/kubepods/burstable/pod{UID}/{CID}\n",
                 CgroupIdentity(Runtime.UNNAMED, CID, UID, "burstable"), id="cgroupfs-v2"),
    pytest.param(_v1(f"/kubepods/burstable/pod{UID}/crio-{CID}"),
                 CgroupIdentity(Runtime.CRIO, CID, UID, "burstable"), id="cgroupfs-crio"),
    pytest.param(_v1(f"/k8s.io/{CID}"), CgroupIdentity(Runtime.CONTAINERD, CID), id="containerd-no-qos-cgroups"),
    pytest.param(_v1(f"/docker/{CID}"), CgroupIdentity(Runtime.DOCKER, CID), id="docker-cgroupfs"),
    pytest.param(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
                 f"cri-containerd-{CID}.scope\n",
                 CgroupIdentity(Runtime.CONTAINERD, CID, UID, "burstable"), id="systemd-v2-containerd"),
    pytest.param(_v1(f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
                     f"crio-{CID}.scope"),
                 CgroupIdentity(Runtime.CRIO, CID, UID, "besteffort"), id="systemd-v1-crio"),
    pytest.param(f"0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope\n",
                 CgroupIdentity(Runtime.DOCKER, CID, UID, "guaranteed"), id="systemd-v2-docker-guaranteed"),
    pytest.param(f"0::/system.slice/docker-{CID}.scope\n", CgroupIdentity(Runtime.DOCKER, CID),
                 id="systemd-docker-outside-kubernetes"),
    pytest.param(f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
                 f"kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
                 CgroupIdentity(Runtime.CONTAINERD, CID, UID, "burstable"), id="systemd-custom-cgroup-root"),
    pytest.param(f"1:name=systemd:/user.slice\n0::/kubepods/burstable/pod{UID}/{CID}\n",
                 CgroupIdentity(Runtime.UNNAMED, CID, UID, "burstable"), id="hybrid-v2-line-wins"),
    pytest.param(f"4:memory:/kubepods/pod{UID}/{CID}\n0::/\n",
                 CgroupIdentity(Runtime.UNNAMED, CID, UID, "guaranteed"), id="hybrid-only-v1-names-it"),
])
def test_known_namings(content: str, expected: CgroupIdentity) -> None:
    assert identity_from_cgroup_file(content) == expected


@pytest.mark.parametrize("content", [
    pytest.param("0::/\n", id="host-process-v2"),
    pytest.param(_v1("/user.slice/user-0.slice/session-1.scope"), id="host-session-v1"),
    pytest.param(_v1(f"/kubepods/burstable/pod{UID}/crio-conmon-{CID}.scope"), id="crio-conmon-monitor"),
    pytest.param(f"0::/machine.slice/libpod-{CID}.scope\n", id="podman-unknown-runtime"),
    pytest.param(f"0::/somewhere/{CID}\n", id="bare-id-outside-any-pod"),
    pytest.param("", id="empty-file"),
    pytest.param("garbage without colons\n", id="garbage"),
])
def test_anything_else_is_unknown_with_a_reason(content: str) -> None:
    found = identity_from_cgroup_file(content)
    assert (found.runtime, found.container_id) == (Runtime.UNKNOWN, "")
    assert found.reason


def _proc_with(tmp_path: Path, pid: int, content: str) -> str:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "cgroup").write_text(content)
    return str(tmp_path)


def test_the_resolver_names_pod_and_container_from_the_directory(tmp_path: Path) -> None:
    directory = InMemoryContainerDirectory()
    directory.add(UID, "ml", "train-0", {"main": f"containerd://{CID}", "sidecar": ""})
    resolve = ContainerResolver(directory, _proc_with(tmp_path, 42, f"0::/k8s.io/{CID}\n"))
    assert resolve(42) == ProcessIdentity(CID, "main", "train-0", "ml")


def test_a_container_the_directory_does_not_know_yet_keeps_its_id_and_pod(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    directory = InMemoryContainerDirectory()
    directory.add(UID, "ml", "train-0", {})
    resolve = ContainerResolver(directory, _proc_with(tmp_path, 42, _v1(f"/kubepods/pod{UID}/{CID}")))
    assert resolve(42) == ProcessIdentity(CID, "", "train-0", "ml")
    assert "not in the container directory" in caplog.text


@pytest.mark.parametrize("pid, content", [
    pytest.param(42, "0::/machine.slice/libpod-x.scope\n", id="unknown-runtime"),
    pytest.param(43, None, id="process-gone"),
])
def test_an_unknown_or_vanished_process_is_in_no_container(tmp_path: Path, pid: int, content: str | None,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    proc = _proc_with(tmp_path, pid, content) if content is not None else str(tmp_path)
    assert ContainerResolver(InMemoryContainerDirectory(), proc)(pid) == ProcessIdentity()
    assert "not in a known container" in caplog.text


def test_removing_a_pod_forgets_its_containers() -> None:
    directory = InMemoryContainerDirectory()
    directory.add(UID, "ml", "train-0", {"main": CID})
    directory.remove_pod(UID)
    assert directory.container(CID) is None and directory.pod(UID) is None


@given(st.text(alphabet=st.sampled_from(list(":/-_.0123456789abcdefkubepods\n")), max_size=300))
def test_no_cgroup_content_makes_the_reader_raise(content: str) -> None:
    found = identity_from_cgroup_file(content)
    assert found.container_id or found.reason
