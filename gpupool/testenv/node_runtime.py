"""The container runtime behind a test kubelet: the fake CRI (default) or real containerd.

Either one is the process that holds the node's private mount namespace
(:mod:`gpupool.testenv.mountns`); kubelet joins it. The fake runtime starts in milliseconds and
runs no processes (fast tests of scheduling and device-plugin calls); containerd runs real
processes in real containers (:mod:`gpupool.testenv.containerd`), for tests that need what a real
runtime does with Allocate's answer (env, device nodes) or real PIDs in real cgroups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpupool.testenv.containerd import (
    RUNTIME_STATE_PATHS,
    Containerd,
    DeviceNode,
    start_containerd,
    stop_containerd,
)
from gpupool.testenv.errors import StartupError
from gpupool.testenv.images import Image, busybox_image, dynamic_image, pause_image
from gpupool.testenv.mountns import namespace_argv
from gpupool.testenv.paths import Binaries
from gpupool.testenv.procs import ManagedProcess, spawn, wait_until
from gpupool.testenv.runtime_tools import ensure_runtime_tools
from gpupool.testenv.steps import Log


class RuntimeKind(StrEnum):
    """Which runtime a kubelet uses (the CLI's ``--runtime``)."""

    FAKE = "fake"
    CONTAINERD = "containerd"


@dataclass(frozen=True)
class NodeImages:
    """The images every containerd node has imported at start (refs for a pod's ``image:``)."""

    pause: Image
    busybox: Image
    dynamic: Image


@dataclass
class NodeRuntime:
    """A started runtime: its process, its CRI socket, and for containerd the handle and images."""

    kind: RuntimeKind
    process: ManagedProcess
    cri_socket: Path
    containerd: Containerd | None = None
    images: NodeImages | None = None

    def to_record(self) -> dict[str, Any]:
        """Extra fields of the kubelet's record (see :func:`stop_recorded_runtime`)."""
        return {"runtime": self.kind.value,
                **({"containerd": self.containerd.to_record()} if self.containerd else {})}

    def stop(self) -> None:
        """Stop the runtime and, for containerd, every container, shim and the pod bridge."""
        if self.containerd is not None:
            stop_containerd(self.containerd.to_record())
        else:
            self.process.stop()


def runtime_state_paths(kind: RuntimeKind) -> tuple[Path, ...]:
    """Host paths besides kubelet's that the runtime needs private (mount points to claim)."""
    return RUNTIME_STATE_PATHS if kind is RuntimeKind.CONTAINERD else ()


def stop_recorded_runtime(record: Mapping[str, Any]) -> None:
    """Stop the runtime of a kubelet record (the runtime process is ``processes[0]``)."""
    if "containerd" in record:
        stop_containerd(record["containerd"])
    else:
        ManagedProcess.from_record(record["processes"][0]).stop()


def start_node_runtime(kind: RuntimeKind, directory: Path, *, binaries: Binaries, binds: Mapping[Path, Path],
                       cwd: Path, image_fs_dir: Path, device_nodes: Sequence[DeviceNode] = (),
                       log: Log = lambda _: None) -> NodeRuntime:
    """Start the runtime in a new mount namespace with ``binds`` and wait for its CRI socket."""
    if kind is RuntimeKind.FAKE:
        if device_nodes:
            raise StartupError("stand-in device nodes need the containerd runtime (the fake one opens nothing)")
        socket = directory / "cri.sock"
        process = spawn("gpupool-fakecri", namespace_argv(binds, cwd, [
            binaries.fakecri, f"--endpoint=unix://{socket}", f"--image-fs-dir={image_fs_dir}"]),
            directory / "logs" / "fakecri.log", executable=binaries.fakecri, cwd=cwd)
        wait_until(socket.is_socket, what="the fake CRI socket", timeout=30.0, watch=[process])
        return NodeRuntime(kind, process, socket)
    tools = ensure_runtime_tools(log)
    images = NodeImages(pause=pause_image(tools), busybox=busybox_image(tools), dynamic=dynamic_image(tools))
    containerd = start_containerd(directory / "containerd", tools=tools, binds=binds, cwd=cwd,
                                  pause=images.pause, device_nodes=device_nodes)
    try:
        containerd.import_image(images.busybox)
        containerd.import_image(images.dynamic)
    except BaseException:
        stop_containerd(containerd.to_record())
        raise
    return NodeRuntime(kind, containerd.process, containerd.layout.socket, containerd, images)
