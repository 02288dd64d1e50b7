"""What a started container must see: the scheduler's cards in the grant's environment and devices."""

from __future__ import annotations

from gpupool.testing.fake_kubelet import FakePod
from gpupool.testing.node_workload import WorkloadPod


def check_container_env(pod: WorkloadPod, fake: FakePod, uuids: dict[int, str]) -> int:
    """Assert every container of ``pod`` saw exactly its placement; returns how many were checked."""
    checked = 0
    for a in pod.placement.containers:
        run = fake.runs[a.container]
        assert not run.conflicts, run.conflicts
        env = run.envs
        where = f"{pod.key}/{a.container}"
        assert env["GPUPOOL_POD"] == f"{pod.key[0]}/{pod.key[1]}", where
        assert env["GPUPOOL_CONTAINER"] == a.container, where
        assert env["GPUPOOL_CARD_INDICES"] == ",".join(str(s.card) for s in a.slices), where
        assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids[s.card] for s in a.slices), where
        assert env["GPUPOOL_MEMORY_LIMIT_MIB"] == ",".join(str(s.memory_mib) for s in a.slices), where
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == ",".join(
            f"{i}={s.memory_mib}M" for i, s in enumerate(a.slices)), where
        assert env["GPUPOOL_COMPUTE_PERCENT"] == ",".join(str(max(1, s.compute // 10) if s.compute else 0)
                                                       for s in a.slices), where
        for s in a.slices:
            assert f"/dev/nvidia{s.card}" in run.devices, where
        assert "/dev/nvidiactl" in run.devices and "/dev/nvidia-uvm" in run.devices
        checked += 1
    return checked
