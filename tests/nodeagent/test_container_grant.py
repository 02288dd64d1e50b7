"""What Allocate hands a container: env and device nodes for exactly its assigned cards."""

from __future__ import annotations

import pytest

from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, Topology
from gpupool.nodeagent.container_grant import GrantError, build_grant
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.types import GrantExtras, Mount

INVENTORY = GpuInventory((GpuCard(0, "GPU-a", "T4", 16384), GpuCard(1, "GPU-b", "T4", 16384)),
                         Topology.flat(2), ("/dev/nvidia0", "/dev/nvidia1"))


def test_shared_slices_on_two_cards() -> None:
    grant = build_grant("ns/p", ContainerAssignment("main", (CardSlice(1, 4096, 300), CardSlice(0, 2048, 205))),
                        {0: "GPU-a", 1: "GPU-b"}, INVENTORY)
    assert grant.envs == {
        "GPUPOOL_ENV_VERSION": "1",
        "NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-a",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M,1=2048M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20",
        "GPUPOOL_MEMORY_LIMIT_MIB": "4096,2048",
        "GPUPOOL_COMPUTE_PERCENT": "30,20",
        "GPUPOOL_CARD_INDICES": "1,0",
        "GPUPOOL_CARD_UUIDS": "GPU-b,GPU-a",
        "GPUPOOL_POD": "ns/p",
        "GPUPOOL_CONTAINER": "main",
    }
    assert [d.host_path for d in grant.devices] == [
        "/dev/nvidia1", "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def test_a_memory_only_slice_is_not_throttled_to_one_percent() -> None:
    """gpushare's meaning: memory without compute shares the card's compute best-effort. MPS must
    not cap such a container at 1 % of the SMs (what it got before)."""
    grant = build_grant("ns/p", ContainerAssignment("main", (CardSlice(0, 4096, 0),)), None, INVENTORY)
    assert grant.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert grant.envs["GPUPOOL_COMPUTE_PERCENT"] == "0"


def test_a_tiny_compute_share_is_still_one_percent() -> None:
    grant = build_grant("ns/p", ContainerAssignment("main", (CardSlice(0, 4096, 5),)), None, INVENTORY)
    assert grant.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"


def test_a_card_replaced_since_scheduling_is_refused() -> None:
    with pytest.raises(GrantError, match="card 1 is GPU-b on this node, the scheduler assigned GPU-old"):
        build_grant("ns/p", ContainerAssignment("main", (CardSlice(1, 4096, 300),)), {1: "GPU-old"}, INVENTORY)
    with pytest.raises(GrantError, match="no GPU with index 7"):
        build_grant("ns/p", ContainerAssignment("main", (CardSlice(7, 4096, 300),)), None, INVENTORY)


def test_the_backend_adds_variables_and_mounts_but_never_replaces_the_contract() -> None:
    slices = ContainerAssignment("main", (CardSlice(0, 4096, 300),))
    plain = build_grant("ns/p", slices, None, INVENTORY)
    mount = Mount("/var/lib/gpupool/containers/u_main", "/var/run/gpupool", read_only=False)
    grant = build_grant("ns/p", slices, None, INVENTORY, GrantExtras({"GPUPOOL_SHIM_TOKEN": "ab" * 32}, (mount,)))
    assert grant.envs == {**plain.envs, "GPUPOOL_SHIM_TOKEN": "ab" * 32}
    assert grant.mounts == (mount,) and grant.devices == plain.devices
    with pytest.raises(GrantError, match="would replace GPUPOOL_MEMORY_LIMIT_MIB"):
        build_grant("ns/p", slices, None, INVENTORY, GrantExtras({"GPUPOOL_MEMORY_LIMIT_MIB": "99999"}))
