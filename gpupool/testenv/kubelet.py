"""A real kubelet backed by the fake CRI runtime or by containerd, in its own mount namespace.

Why a mount namespace: kubelet hard-codes ``/var/lib/kubelet/device-plugins`` (``--root-dir`` does
not move it), bind-mounts its root directory onto itself, and writes ``/var/log/pods`` and
``/var/log/containers``. Running the runtime under ``unshare --mount`` with private directories
bind-mounted over those three paths (:mod:`gpupool.testenv.mountns`) means that

* the machine's own ``/var/lib/kubelet`` and ``/var/log`` are never touched,
* several kubelets (one per node name) can run side by side, each with its own device-plugin
  directory,
* every mount kubelet makes dies with the namespace, so cleanup is deleting one directory.

The runtime process holds the namespace; kubelet joins it with ``nsenter``. A kubelet can
therefore be restarted (device-plugin re-registration tests) while the containers survive, as on
a real node. The runtime is the fake CRI by default, or real containerd with
``runtime="containerd"`` (:mod:`gpupool.testenv.node_runtime`).

Host-side paths of a kubelet's files are exposed on :class:`Kubelet` (``device_plugin_dir``,
``pod_resources_socket``): a unix socket is reachable through any path to its directory, so a
device plugin running on the host can register with this kubelet through them.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from gpupool.testenv.config import render_kubelet_config
from gpupool.testenv.containerd import DeviceNode
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.errors import StartupError
from gpupool.testenv.images import Image
from gpupool.testenv.mountns import (
    claim_mount_points,
    created_mount_points,
    mounts_below,
    release_mount_points,
    remove_mount_points,
    unmount_below,
)
from gpupool.testenv.node_runtime import (
    NodeImages,
    NodeRuntime,
    RuntimeKind,
    runtime_state_paths,
    start_node_runtime,
    stop_recorded_runtime,
)
from gpupool.testenv.nodeip import find_node_ip
from gpupool.testenv.ports import free_ports
from gpupool.testenv.probe import http_get, http_request, is_ok
from gpupool.testenv.procs import ManagedProcess, spawn, wait_until
from gpupool.testenv.steps import Log

__all__ = ["Kubelet", "created_mount_points", "kubelet_args", "mounts_below", "node_is_ready",
           "remove_mount_points", "start_kubelet", "stop_recorded_kubelet", "wait_node_ready"]

#: Paths kubelet (or the runtime, on its behalf) writes, each replaced by a private directory.
KUBELET_ROOT = Path("/var/lib/kubelet")
POD_LOG_DIR = Path("/var/log/pods")
CONTAINER_LOG_DIR = Path("/var/log/containers")


@dataclass
class Kubelet:
    """A running kubelet for node ``node_name``; stop it with :meth:`stop` (or as a context manager)."""

    node_name: str
    node_ip: str
    directory: Path
    control_plane: ControlPlane
    runtime: NodeRuntime
    kubelet: ManagedProcess
    port: int
    healthz_port: int
    labels: Mapping[str, str] = field(default_factory=dict)
    extra_config: Mapping[str, Any] = field(default_factory=dict)
    _stopped: bool = field(default=False, repr=False)

    def to_record(self) -> dict[str, Any]:
        """A JSON-serialisable description, so another process can stop this kubelet."""
        return {"node_name": self.node_name, "directory": str(self.directory),
                "processes": [self.runtime.process.to_record(), self.kubelet.to_record()],
                **self.runtime.to_record()}

    def __enter__(self) -> Kubelet:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def fakecri(self) -> ManagedProcess:
        """The runtime process, which holds the namespace (the fake runtime's, or containerd's)."""
        return self.runtime.process

    @property
    def images(self) -> NodeImages:
        """The images a containerd node imported at start (``.busybox.ref`` for a pod's image)."""
        if self.runtime.images is None:
            raise StartupError(f"node {self.node_name} runs the fake runtime: no images")
        return self.runtime.images

    def import_image(self, image: Image) -> None:
        """Make ``image`` (e.g. from :func:`gpupool.testenv.images.build_image`) runnable here."""
        if self.runtime.containerd is None:
            raise StartupError(f"node {self.node_name} runs the fake runtime: it runs no images")
        self.runtime.containerd.import_image(image)

    @property
    def root_dir(self) -> Path:
        """Host path of this kubelet's ``/var/lib/kubelet``."""
        return self.directory / "root"

    @property
    def device_plugin_dir(self) -> Path:
        """Host path of ``/var/lib/kubelet/device-plugins`` (kubelet.sock, plugin sockets)."""
        return self.root_dir / "device-plugins"

    @property
    def kubelet_socket(self) -> Path:
        """Host path of the device-plugin Registration socket."""
        return self.device_plugin_dir / "kubelet.sock"

    @property
    def pod_resources_socket(self) -> Path:
        """Host path of the PodResources API socket."""
        return self.root_dir / "pod-resources" / "kubelet.sock"

    @property
    def cri_socket(self) -> Path:
        """The runtime's CRI socket."""
        return self.runtime.cri_socket

    def restart(self, timeout: float = 60.0) -> None:
        """Stop and start kubelet only; the runtime (and its containers) keep running.

        Returns when the node is Ready again. As on a real node, kubelet wipes the device-plugin
        directory on start, so plugins must register again.
        """
        old_socket = _identity(self.kubelet_socket)
        self.kubelet.stop()
        restarted_at = time.time()
        self.kubelet = _start_kubelet_process(self, self.port)
        self._wait_up(restarted_at, old_socket, timeout)

    def _wait_up(self, since: float, old_socket: tuple[int, int] | None, timeout: float) -> None:
        """Wait until this kubelet process serves: health, device manager, fresh Ready heartbeat.

        The Node object may still say Ready from before a restart, so readiness also requires a
        re-created Registration socket (the device manager started) and a heartbeat after ``since``.
        """
        watch = [self.kubelet, self.runtime.process]
        wait_until(partial(is_ok, f"http://127.0.0.1:{self.healthz_port}/healthz"),
                   what=f"kubelet {self.node_name} /healthz", timeout=timeout, watch=watch)
        wait_until(lambda: _identity(self.kubelet_socket) not in (None, old_socket),
                   what=f"kubelet {self.node_name} device-plugin socket", timeout=timeout, watch=watch)
        wait_node_ready(self.control_plane, self.node_name, timeout=timeout, watch=watch,
                        heartbeat_since=since)

    def stop(self, delete_node: bool = False) -> None:
        """Stop kubelet, then the runtime (ending the namespace), and delete the private directories.

        ``delete_node`` also deletes the Node object (otherwise it stays, NotReady after a while,
        as when a real node dies).
        """
        if self._stopped:
            return
        self.kubelet.stop()
        self.runtime.stop()
        self._stopped = True
        unmount_below(self.directory)
        shutil.rmtree(self.directory, ignore_errors=True)
        if delete_node:
            _delete_node(self.control_plane, self.node_name)
        release_mount_points(self.node_name)


def start_kubelet(
    control_plane: ControlPlane,
    node_name: str,
    *,
    labels: Mapping[str, str] | None = None,
    extra_config: Mapping[str, Any] | None = None,
    node_ip: str | None = None,
    wait_ready: bool = True,
    timeout: float = 90.0,
    runtime: RuntimeKind | str = RuntimeKind.FAKE,
    device_nodes: Sequence[DeviceNode] = (),
    log: Log = lambda _: None,
) -> Kubelet:
    """Start a runtime and a kubelet that registers node ``node_name`` with ``control_plane``.

    ``labels`` become ``--node-labels`` (kubelet rejects unknown ``kubernetes.io`` labels);
    ``extra_config`` is merged into the KubeletConfiguration (e.g. ``featureGates``). With
    ``wait_ready`` (default) this returns once the Node's Ready condition is True. ``runtime``:
    ``"fake"`` (no processes, milliseconds) or ``"containerd"`` (real containers; installs Debian's
    containerd, runc, CNI plugins and busybox on first use); ``device_nodes`` are stand-in device
    nodes in the node's ``/dev`` (containerd only).
    """
    started_at = time.time()
    kind = RuntimeKind(runtime)
    node_ip = node_ip or find_node_ip()
    directory = control_plane.state_dir / "kubelets" / node_name
    if directory.exists():
        raise StartupError(f"a kubelet for node {node_name!r} already runs in {directory}")
    for sub in ("root", "log-pods", "log-containers", "cwd", "logs"):
        (directory / sub).mkdir(parents=True)
    claim_mount_points(node_name, [KUBELET_ROOT, POD_LOG_DIR, CONTAINER_LOG_DIR, *runtime_state_paths(kind)])
    node_runtime: NodeRuntime | None = None
    try:
        binds = {directory / "root": KUBELET_ROOT, directory / "log-pods": POD_LOG_DIR,
                 directory / "log-containers": CONTAINER_LOG_DIR}
        node_runtime = start_node_runtime(kind, directory, binaries=control_plane.binaries, binds=binds,
                                          cwd=directory / "cwd", image_fs_dir=KUBELET_ROOT,
                                          device_nodes=device_nodes, log=log)
        port, healthz_port = free_ports(2)
        (directory / "kubelet.yaml").write_text(render_kubelet_config(
            address=node_ip, port=port, healthz_port=healthz_port,
            runtime_endpoint=f"unix://{node_runtime.cri_socket}", extra=extra_config))
        kubelet = Kubelet(node_name=node_name, node_ip=node_ip, directory=directory,
                          control_plane=control_plane, runtime=node_runtime,
                          kubelet=node_runtime.process,  # replaced just below
                          port=port, healthz_port=healthz_port, labels=dict(labels or {}),
                          extra_config=dict(extra_config or {}))
        kubelet.kubelet = _start_kubelet_process(kubelet, port)
    except BaseException:
        if node_runtime is not None:
            node_runtime.stop()
        unmount_below(directory)
        shutil.rmtree(directory, ignore_errors=True)
        release_mount_points(node_name)
        raise
    if wait_ready:
        try:
            kubelet._wait_up(started_at, None, timeout)
        except BaseException:
            kubelet.stop()
            raise
    return kubelet


def kubelet_args(kubelet: Kubelet) -> list[str]:
    """kubelet's command-line flags (everything not expressible in the config file)."""
    args = [
        f"--config={kubelet.directory / 'kubelet.yaml'}",
        f"--kubeconfig={kubelet.control_plane.kubeconfig}",
        f"--hostname-override={kubelet.node_name}",
        f"--node-ip={kubelet.node_ip}",
        "--register-node=true",
        f"--root-dir={KUBELET_ROOT}",
        "--v=2",
    ]
    if kubelet.labels:
        args.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(kubelet.labels.items())))
    return args


def _start_kubelet_process(kubelet: Kubelet, port: int) -> ManagedProcess:
    """Start kubelet inside the runtime's mount namespace, from the empty working directory.

    The empty directory matters: a container with an empty log path makes kubelet delete
    ``<log path>*`` relative to its working directory.
    """
    binary = kubelet.control_plane.binaries.kubelet
    return spawn("kubelet", [
        "nsenter", f"--mount=/proc/{kubelet.runtime.process.pid}/ns/mnt", f"--wd={kubelet.directory / 'cwd'}",
        "--", binary, *kubelet_args(kubelet),
    ], kubelet.directory / "logs" / "kubelet.log", executable=binary, cwd=kubelet.directory / "cwd")


def stop_recorded_kubelet(record: Mapping[str, Any]) -> None:
    """Stop a kubelet described by :meth:`Kubelet.to_record` (kubelet, then its runtime) and
    delete its directory."""
    ManagedProcess.from_record(record["processes"][-1]).stop()
    stop_recorded_runtime(record)
    directory = Path(record["directory"])
    unmount_below(directory)
    shutil.rmtree(directory, ignore_errors=True)


def node_is_ready(node: Mapping[str, Any], heartbeat_since: float | None = None) -> bool:
    """Whether a Node object (as JSON) has condition Ready=True.

    With ``heartbeat_since`` (a Unix time) the condition's heartbeat must also be no older than
    that second, which tells a live kubelet from a stale status left by a stopped one.
    """
    for condition in node.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            if condition.get("status") != "True":
                return False
            if heartbeat_since is None:
                return True
            heartbeat = datetime.fromisoformat(condition["lastHeartbeatTime"].replace("Z", "+00:00"))
            return heartbeat.timestamp() >= int(heartbeat_since)
    return False


def wait_node_ready(control_plane: ControlPlane, node_name: str, *, timeout: float = 90.0,
                    watch: Sequence[ManagedProcess] = (), heartbeat_since: float | None = None) -> None:
    """Block until Node ``node_name`` exists and is Ready (seconds: docs/testenv.md, "Timings")."""

    def ready() -> bool:
        status, body = http_get(f"{control_plane.server}/api/v1/nodes/{node_name}",
                                token=control_plane.token, ca_cert=control_plane.ca_cert)
        return status == 200 and node_is_ready(json.loads(body), heartbeat_since)

    wait_until(ready, what=f"node {node_name} Ready", timeout=timeout, watch=watch, interval=0.5)


def _identity(path: Path) -> tuple[int, int] | None:
    """Inode and change time of ``path`` (tells a re-created socket from the old one), or ``None``.

    The inode alone is not enough: the file system may give the new socket the old one's number.
    """
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_ctime_ns


def _delete_node(control_plane: ControlPlane, node_name: str) -> None:
    http_request(f"{control_plane.server}/api/v1/nodes/{node_name}", method="DELETE",
                 token=control_plane.token, ca_cert=control_plane.ca_cert)
