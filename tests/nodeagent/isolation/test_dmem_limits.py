"""dmem.max per container: PCI addresses to region names, finding the container's cgroup, writing
the limit with the controller enabled above it, and refusing cards whose region is not listed."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpupool.core.model import GpuCard, Topology
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.isolation.backends import NoEnforcement
from gpupool.nodeagent.isolation.dmem import PciAddressError, detect_dmem, kernel_pci_address
from gpupool.nodeagent.isolation.dmem_backend import DmemEnforcement
from gpupool.nodeagent.isolation.dmem_cgroups import DmemWriteError, write_limit
from gpupool.nodeagent.isolation.dmem_limits import DmemLimiter, LimitState
from gpupool.nodeagent.isolation.report import IsolationCollector, isolation_table
from gpupool.nodeagent.isolation.setup import with_dmem
from tests.nodeagent.isolation.dmem_tree import (
    CONTAINER_ID,
    DRM_BUS_ID,
    DRM_REGION,
    GIB_MIB,
    NVIDIA_BUS_ID,
    NVIDIA_REGION,
    POD_UID,
    UNLISTED_BUS_ID,
    cgroup_root,
    container_cgroup,
    pod_view,
)

GIB = 1 << 30
BUSES = {0: NVIDIA_BUS_ID, 1: DRM_BUS_ID, 2: UNLISTED_BUS_ID, 3: ""}


@pytest.mark.parametrize(("bus_id", "address"), [
    pytest.param("00000000:3B:00.0", "0000:3b:00.0", id="nvml-form"),
    pytest.param("0000:3b:00.0", "0000:3b:00.0", id="kernel-form"),
    pytest.param("00000001:AF:1F.7", "0001:af:1f.7", id="domain-and-function"),
])
def test_kernel_pci_address(bus_id: str, address: str) -> None:
    assert kernel_pci_address(bus_id) == address


@pytest.mark.parametrize("bus_id", [
    pytest.param("", id="empty"),
    pytest.param("3B:00.0", id="no-domain"),
    pytest.param("00000000:3B:00.8", id="function-past-7"),
    pytest.param("00010000:3B:00.0", id="domain-past-16-bits"),
    pytest.param("nvidia/0000:3b:00.0/vidmem", id="a-region-name"),
])
def test_malformed_pci_addresses_are_refused(bus_id: str) -> None:
    with pytest.raises(PciAddressError):
        kernel_pci_address(bus_id)


def limiter_for(root: Path, directory: InMemoryContainerDirectory | None = None) -> DmemLimiter:
    status = detect_dmem(str(root))
    assert status.controller
    if directory is None:
        directory = InMemoryContainerDirectory()
        directory.add(POD_UID, "ml", "trainer", {"main": f"containerd://{CONTAINER_ID}"})
    return DmemLimiter(status, BUSES, directory, str(root))


def test_card_regions_nvidia_then_drm_names_and_the_reasons_for_none(tmp_path: Path) -> None:
    limiter = limiter_for(cgroup_root(tmp_path))
    assert {c: r.region for c, r in limiter.regions.items()} == {0: NVIDIA_REGION, 1: DRM_REGION, 2: "", 3: ""}
    assert "no region of 00000000:5E:00.0 in dmem.capacity" in limiter.regions[2].reason
    assert "no PCI address" in limiter.regions[3].reason


def test_the_limit_is_written_once_the_container_cgroup_exists(tmp_path: Path) -> None:
    root = cgroup_root(tmp_path)
    limiter = limiter_for(root)
    limiter.want(pod_view({0: 4 * GIB_MIB, 1: 2 * GIB_MIB}), "main")
    assert limiter.apply() == 0  # the container has not started: nothing to write to yet
    assert {v.state for v in limiter.report().limits} == {LimitState.WAITING}
    scope = container_cgroup(root)
    assert limiter.apply() == 2
    assert (scope / "dmem.max").read_text() == f"{DRM_REGION} {2 * GIB}\n"  # one region per write
    limits = limiter.report().limits
    assert [(v.card, v.region, v.limit_bytes, v.state) for v in limits] == [
        (0, NVIDIA_REGION, 4 * GIB, LimitState.APPLIED), (1, DRM_REGION, 2 * GIB, LimitState.APPLIED)]
    assert all(v.cgroup == str(scope) for v in limits)
    # dmem enabled from the root down to the pod, not in the container's own cgroup
    for directory in (root, *scope.parents):
        if str(directory).startswith(str(root)):
            assert (directory / "cgroup.subtree_control").read_text() == "+dmem\n", directory
    assert (scope / "cgroup.subtree_control").read_text() == ""
    assert limiter.apply() == 0  # applied limits are not written again


def test_a_card_whose_region_is_not_listed_is_refused_and_never_written(tmp_path: Path) -> None:
    root = cgroup_root(tmp_path)
    scope = container_cgroup(root)
    limiter = limiter_for(root)
    limiter.want(pod_view({2: 4 * GIB_MIB, 3: GIB_MIB}), "main")
    assert limiter.apply() == 0
    limits = limiter.report().limits
    assert [(v.card, v.state) for v in limits] == [(2, LimitState.REFUSED), (3, LimitState.REFUSED)]
    assert "not in dmem.capacity" in limits[0].detail or "no region" in limits[0].detail
    assert (scope / "dmem.max").read_text() == ""


def test_memory_less_slices_and_containers_without_gpus_get_no_limit(tmp_path: Path) -> None:
    limiter = limiter_for(cgroup_root(tmp_path))
    limiter.want(pod_view({0: 0}), "main")
    limiter.want(pod_view({0: GIB_MIB}), "sidecar")
    assert limiter.report().limits == ()


def test_a_cgroup_without_dmem_max_fails_with_the_reason_and_is_retried(tmp_path: Path) -> None:
    root = cgroup_root(tmp_path)
    scope = container_cgroup(root, dmem=False)  # the kernel did not give it the file
    limiter = limiter_for(root)
    limiter.want(pod_view({0: GIB_MIB}), "main")
    assert limiter.apply() == 0
    (failed,) = limiter.report().limits
    assert failed.state is LimitState.FAILED and "dmem.max does not exist" in failed.detail
    (scope / "dmem.max").write_text("")
    assert limiter.apply() == 1
    assert limiter.report().limits[0].state is LimitState.APPLIED


def test_a_restarted_container_gets_the_limit_in_its_new_cgroup(tmp_path: Path) -> None:
    root = cgroup_root(tmp_path)
    old = container_cgroup(root)
    directory = InMemoryContainerDirectory()
    directory.add(POD_UID, "ml", "trainer", {"main": f"containerd://{CONTAINER_ID}"})
    limiter = limiter_for(root, directory)
    limiter.want(pod_view({0: GIB_MIB}), "main")
    assert limiter.apply() == 1
    for name in ("dmem.max", "cgroup.procs", "cgroup.subtree_control"):
        (old / name).unlink()
    old.rmdir()
    new_id = "b" * 64
    directory.add(POD_UID, "ml", "trainer", {"main": f"containerd://{new_id}"})
    new = container_cgroup(root, new_id)
    assert limiter.apply() == 1
    assert (new / "dmem.max").read_text() == f"{NVIDIA_REGION} {GIB}\n"


def test_a_pod_recreated_under_the_same_name_is_not_limited_by_the_old_grant(tmp_path: Path) -> None:
    root = cgroup_root(tmp_path)
    other_uid = "0" * 8 + "-0000-0000-0000-" + "0" * 12
    scope = container_cgroup(root, pod_uid=other_uid)
    limiter = limiter_for(root)  # the directory says CONTAINER_ID is ml/trainer/main
    limiter.want(pod_view({0: GIB_MIB}), "main")  # granted to POD_UID
    assert limiter.apply() == 0
    assert (scope / "dmem.max").read_text() == ""


def test_gone_pods_are_forgotten(tmp_path: Path) -> None:
    limiter = limiter_for(cgroup_root(tmp_path))
    limiter.want(pod_view({0: GIB_MIB}), "main")
    limiter.forget_gone({POD_UID})
    assert len(limiter.report().limits) == 1
    limiter.forget_gone(set())
    assert limiter.report().limits == ()


def test_the_writer_checks_what_the_kernel_kept(tmp_path: Path) -> None:
    root = cgroup_root(tmp_path)
    scope = container_cgroup(root)
    (scope / "dmem.max").unlink()
    (scope / "dmem.max").symlink_to("/dev/null")  # accepts the write, keeps nothing
    with pytest.raises(DmemWriteError, match=re.escape(f"reads {NVIDIA_REGION} (absent) after writing")):
        write_limit(str(root), str(scope), NVIDIA_REGION, GIB)


def test_no_dmem_controller_leaves_the_backend_unwrapped(tmp_path: Path) -> None:
    inner = NoEnforcement()
    status = detect_dmem(str(tmp_path))  # no cgroup.controllers at all
    assert with_dmem(inner, status, BUSES, InMemoryContainerDirectory(), str(tmp_path)) is inner


def test_the_wrapper_grants_what_the_backend_grants_and_writes_in_the_background(tmp_path: Path) -> None:
    root = cgroup_root(tmp_path)
    scope = container_cgroup(root)
    directory = InMemoryContainerDirectory()
    directory.add(POD_UID, "ml", "trainer", {"main": f"containerd://{CONTAINER_ID}"})
    wrapped = with_dmem(NoEnforcement(), detect_dmem(str(root)), BUSES, directory, str(root))
    assert isinstance(wrapped, DmemEnforcement)
    wrapped = DmemEnforcement(wrapped.inner, wrapped.limiter, interval_s=0.01)
    pod = pod_view({0: 4 * GIB_MIB})
    assert wrapped.grant_extras(pod, "main") == NoEnforcement().grant_extras(pod, "main")

    async def main() -> None:
        task = asyncio.create_task(wrapped.run(lambda: {POD_UID: ("ml", "trainer")}))
        for _ in range(200):
            if (scope / "dmem.max").read_text():
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert (scope / "dmem.max").read_text() == f"{NVIDIA_REGION} {4 * GIB}\n"
    state = wrapped.state()
    assert state.dmem is not None and state.dmem.limits[0].state is LimitState.APPLIED


@dataclass
class AgentStub:
    """What the isolation report reads of the agent."""

    enforcement: DmemEnforcement
    inventory: GpuInventory
    node: str = "node-a"


def test_metrics_and_usage_say_which_cards_dmem_caps_and_each_limit(tmp_path: Path) -> None:
    root = cgroup_root(tmp_path)
    container_cgroup(root)
    limiter = limiter_for(root)
    limiter.want(pod_view({0: 4 * GIB_MIB, 2: GIB_MIB}), "main")
    limiter.apply()
    cards = tuple(GpuCard(i, f"GPU-{i}", "H200", 143771) for i in range(4))
    agent = AgentStub(DmemEnforcement(NoEnforcement(), limiter),
                      GpuInventory(cards, Topology.flat(4), tuple(f"/dev/nvidia{i}" for i in range(4))))
    families = {f.name: f for f in IsolationCollector(agent).collect()}  # type: ignore[arg-type]
    by_dmem = {(s.labels["card"], s.labels["region"]): s.value
               for s in families["gpupool_card_memory_enforced_by_dmem"].samples}
    assert by_dmem == {("0", NVIDIA_REGION): 1.0, ("1", DRM_REGION): 1.0, ("2", ""): 0.0, ("3", ""): 0.0}
    limits = {(s.labels["card"], s.labels["state"]): s.value
              for s in families["gpupool_container_dmem_limit_bytes"].samples}
    assert limits == {("0", "applied"): 4 * GIB, ("2", "refused"): GIB}
    table = isolation_table(agent)  # type: ignore[arg-type]
    assert f"memory also by dmem ({NVIDIA_REGION})" in table
    assert "no dmem: no region of 00000000:5E:00.0 in dmem.capacity" in table
    assert f"ml/trainer/main{' ' * 33}0     {4 * GIB:>14}  applied" in table
