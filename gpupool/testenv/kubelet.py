"""A real kubelet backed by the fake CRI runtime, in its own mount namespace.

Why a mount namespace: kubelet hard-codes ``/var/lib/kubelet/device-plugins`` (``--root-dir`` does
not move it), bind-mounts its root directory onto itself, and writes ``/var/log/pods`` and
``/var/log/containers``. Running the fake runtime under ``unshare --mount`` with private
directories bind-mounted over those three paths means that

* the machine's own ``/var/lib/kubelet`` and ``/var/log`` are never touched,
* several kubelets (one per node name) can run side by side, each with its own device-plugin
  directory,
* every mount kubelet makes dies with the namespace, so cleanup is deleting one directory.

The fake runtime process holds the namespace; kubelet joins it with ``nsenter``. A kubelet can
therefore be restarted (device-plugin re-registration tests) while the "containers" in the fake
runtime survive, as they would with a real container engine.

Host-side paths of a kubelet's files are exposed on :class:`Kubelet` (``device_plugin_dir``,
``pod_resources_socket``): a unix socket is reachable through any path to its directory, so a
device plugin running on the host can register with this kubelet through them.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from gpupool.testenv.config import render_kubelet_config
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.errors import StartupError
from gpupool.testenv.nodeip import find_node_ip
from gpupool.testenv.ports import free_ports
from gpupool.testenv.probe import http_get, http_request, is_ok
from gpupool.testenv.procs import ManagedProcess, spawn, wait_until

#: Paths kubelet (or the runtime, on its behalf) writes, each replaced by a private directory.
KUBELET_ROOT = Path("/var/lib/kubelet")
POD_LOG_DIR = Path("/var/log/pods")
CONTAINER_LOG_DIR = Path("/var/log/containers")

# Mount points this process created on the host (they must exist to be mounted over) and the
# kubelets that use them; a mount point is removed when the last of our kubelets stops.
_registry_lock = threading.Lock()
_created_mount_points: set[Path] = set()
_live_kubelets: set[str] = set()


@dataclass
class Kubelet:
    """A running kubelet for node ``node_name``; stop it with :meth:`stop` (or as a context manager)."""

    node_name: str
    node_ip: str
    directory: Path
    control_plane: ControlPlane
    fakecri: ManagedProcess
    kubelet: ManagedProcess
    port: int
    healthz_port: int
    labels: Mapping[str, str] = field(default_factory=dict)
    extra_config: Mapping[str, Any] = field(default_factory=dict)
    _stopped: bool = field(default=False, repr=False)

    def to_record(self) -> dict[str, Any]:
        """A JSON-serialisable description, so another process can stop this kubelet."""
        return {"node_name": self.node_name, "directory": str(self.directory),
                "processes": [self.fakecri.to_record(), self.kubelet.to_record()]}

    def __enter__(self) -> Kubelet:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

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
        """The fake runtime's socket."""
        return self.directory / "cri.sock"

    def restart(self, timeout: float = 60.0) -> None:
        """Stop and start kubelet only; the fake runtime (and its "containers") keep running.

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
        watch = [self.kubelet, self.fakecri]
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
        self.fakecri.stop()
        self._stopped = True
        _unmount_below(self.directory)
        shutil.rmtree(self.directory, ignore_errors=True)
        if delete_node:
            _delete_node(self.control_plane, self.node_name)
        _release_mount_points(self.node_name)


def start_kubelet(
    control_plane: ControlPlane,
    node_name: str,
    *,
    labels: Mapping[str, str] | None = None,
    extra_config: Mapping[str, Any] | None = None,
    node_ip: str | None = None,
    wait_ready: bool = True,
    timeout: float = 90.0,
) -> Kubelet:
    """Start the fake runtime and a kubelet that registers node ``node_name`` with ``control_plane``.

    ``labels`` become ``--node-labels`` (kubelet rejects unknown ``kubernetes.io`` labels);
    ``extra_config`` is merged into the KubeletConfiguration (e.g. ``featureGates``). With
    ``wait_ready`` (default) this returns once the Node's Ready condition is True.
    """
    started_at = time.time()
    binaries = control_plane.binaries
    node_ip = node_ip or find_node_ip()
    directory = control_plane.state_dir / "kubelets" / node_name
    if directory.exists():
        raise StartupError(f"a kubelet for node {node_name!r} already runs in {directory}")
    for sub in ("root", "log-pods", "log-containers", "cwd", "logs"):
        (directory / sub).mkdir(parents=True)
    _claim_mount_points(node_name)
    fakecri: ManagedProcess | None = None
    try:
        # The runtime holds the namespace; `exec` makes its pid the one we get from Popen.
        script = (
            'set -e; mount --bind "$1" "$2"; mount --bind "$3" "$4"; mount --bind "$5" "$6"; '
            'cd "$7"; shift 7; exec "$@"'
        )
        fakecri = spawn("gpupool-fakecri", [
            "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            directory / "root", KUBELET_ROOT, directory / "log-pods", POD_LOG_DIR,
            directory / "log-containers", CONTAINER_LOG_DIR, directory / "cwd",
            binaries.fakecri, f"--endpoint=unix://{directory / 'cri.sock'}",
            f"--image-fs-dir={KUBELET_ROOT}",
        ], directory / "logs" / "fakecri.log", executable=binaries.fakecri, cwd=directory / "cwd")
        runtime = fakecri
        wait_until(lambda: (directory / "cri.sock").is_socket(), what="the fake CRI socket",
                   timeout=30.0, watch=[runtime])
        port, healthz_port = free_ports(2)
        (directory / "kubelet.yaml").write_text(render_kubelet_config(
            address=node_ip, port=port, healthz_port=healthz_port, extra=extra_config))
        kubelet = Kubelet(node_name=node_name, node_ip=node_ip, directory=directory,
                          control_plane=control_plane, fakecri=fakecri,
                          kubelet=fakecri,  # replaced just below
                          port=port, healthz_port=healthz_port, labels=dict(labels or {}),
                          extra_config=dict(extra_config or {}))
        kubelet.kubelet = _start_kubelet_process(kubelet, port)
    except BaseException:
        if fakecri is not None:
            fakecri.stop()
        shutil.rmtree(directory, ignore_errors=True)
        _release_mount_points(node_name)
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
        "--container-runtime=remote",
        f"--container-runtime-endpoint=unix://{kubelet.cri_socket}",
        f"--image-service-endpoint=unix://{kubelet.cri_socket}",
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
        "nsenter", f"--mount=/proc/{kubelet.fakecri.pid}/ns/mnt", f"--wd={kubelet.directory / 'cwd'}",
        "--", binary, *kubelet_args(kubelet),
    ], kubelet.directory / "logs" / "kubelet.log", executable=binary, cwd=kubelet.directory / "cwd")


def stop_recorded_kubelet(record: Mapping[str, Any]) -> None:
    """Stop a kubelet described by :meth:`Kubelet.to_record` and delete its directory."""
    for proc_record in reversed(record["processes"]):
        ManagedProcess.from_record(proc_record).stop()
    directory = Path(record["directory"])
    _unmount_below(directory)
    shutil.rmtree(directory, ignore_errors=True)


def created_mount_points() -> list[Path]:
    """The mount points (``/var/lib/kubelet`` ...) this process created on the host."""
    with _registry_lock:
        return sorted(_created_mount_points)


def remove_mount_points(paths: Sequence[Path]) -> None:
    """``rmdir`` each of ``paths`` if still empty (for ``gpupool testenv down``).

    Only call this when no kubelet of the test environment runs: an empty mount point of a live
    kubelet in another namespace would be detached by ``rmdir``.
    """
    for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir()


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


def _claim_mount_points(node_name: str) -> None:
    """Make sure the three paths exist on the host (a bind mount needs a target)."""
    with _registry_lock:
        for path in (KUBELET_ROOT, POD_LOG_DIR, CONTAINER_LOG_DIR):
            if not path.exists():
                path.mkdir(parents=True)
                _created_mount_points.add(path)
        _live_kubelets.add(node_name)


def _release_mount_points(node_name: str) -> None:
    """Remove the mount points we created once none of our kubelets needs them."""
    with _registry_lock:
        _live_kubelets.discard(node_name)
        if _live_kubelets:
            return
        for path in sorted(_created_mount_points, reverse=True):
            # rmdir only succeeds on an empty directory: never delete what someone else put there.
            with contextlib.suppress(OSError):
                path.rmdir()
        _created_mount_points.clear()


def mounts_below(directory: Path, mountinfo: str) -> list[Path]:
    """Mount points at or below ``directory`` listed in a ``/proc/self/mountinfo`` text, deepest first."""
    prefix = str(directory).rstrip("/")
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _unmount_below(directory: Path) -> None:
    """Defensive: lazily unmount anything still mounted under ``directory`` in our namespace.

    Normally nothing is (kubelet's mounts live and die in its own namespace), but deleting a
    directory with a live bind mount under it would delete the mounted files too.
    """
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return
    for point in mounts_below(directory, mountinfo):
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
