"""A fake cgroup v2 tree with the ``dmem`` controller, laid out as kubelet's systemd driver does.

The kernel here has no ``dmem`` (and a hybrid cgroup layout), so the limit writer is tested on
plain files: ``cgroup.controllers`` and ``dmem.capacity`` at the root, ``cgroup.subtree_control``
in every cgroup, and ``dmem.max`` where the kernel would have made one.
"""

from __future__ import annotations

from pathlib import Path

from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.nodeagent.types import NodeAssignment, PodView

NVIDIA_BUS_ID = "00000000:3B:00.0"
NVIDIA_REGION = "nvidia/0000:3b:00.0/vidmem"
DRM_BUS_ID = "00000000:3C:00.0"
DRM_REGION = "drm/0000:3c:00.0/vram0"
UNLISTED_BUS_ID = "00000000:5E:00.0"
CAPACITY = f"{NVIDIA_REGION} 150754820096\n{DRM_REGION} 8514437120\ndrm/0000:3c:00.0/stolen 67108864\n"
POD_UID = "3f1c2a4e-8b7d-4c21-9a55-0d6e7f8a9b10"
CONTAINER_ID = "a" * 64
GIB_MIB = 1024


def cgroup_root(root: Path, capacity: str = CAPACITY) -> Path:
    """The root cgroup: controllers with ``dmem``, its regions, the kubepods slices."""
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids rdma misc dmem\n")
    (root / "dmem.capacity").write_text(capacity)
    _cgroup(root, "cpu memory pids")
    for slice_ in ("kubepods.slice", "kubepods.slice/kubepods-burstable.slice"):
        _cgroup(root / slice_, "cpu memory pids")
    return root


def _cgroup(path: Path, subtree: str = "", dmem: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.procs").write_text("")
    (path / "cgroup.subtree_control").write_text(subtree + "\n" if subtree else "")
    if dmem:
        (path / "dmem.max").write_text("")
    return path


def pod_cgroup(root: Path, pod_uid: str = POD_UID) -> Path:
    name = f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice"
    return _cgroup(root / "kubepods.slice" / "kubepods-burstable.slice" / name, "cpu memory pids")


def container_cgroup(root: Path, container_id: str = CONTAINER_ID, pod_uid: str = POD_UID,
                     dmem: bool = True) -> Path:
    """The container's scope; ``dmem``: whether the kernel gave it ``dmem.max`` (enabled above)."""
    return _cgroup(pod_cgroup(root, pod_uid) / f"cri-containerd-{container_id}.scope", dmem=dmem)


def pod_view(slices: dict[int, int], container: str = "main", pod_uid: str = POD_UID,
             name: str = "trainer") -> PodView:
    """A pod whose one container holds ``slices`` (card → MiB)."""
    assignment = ContainerAssignment(container, tuple(CardSlice(c, m, 30) for c, m in slices.items()))
    placement = Placement(f"ml/{name}", "node-a", 0, 0, (assignment,))
    return PodView("ml", name, pod_uid, "node-a", 0.0, False, (),
                   NodeAssignment(placement, {c: f"GPU-{c}" for c in slices}))
