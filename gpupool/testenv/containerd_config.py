"""Pure renderers of containerd 2's configuration and the CNI network of a test node (no I/O).

Every path containerd would write by default (``/var/lib/containerd``, ``/run/containerd``,
``/opt/containerd``, its temporary files, runc's state, the network namespaces, the CNI leases,
the CDI specs) is moved under the node's own directory, so several nodes run side by side and
stopping one deletes one directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: containerd's namespace for everything the CRI plugin (that is, kubelet) creates.
K8S_NAMESPACE = "k8s.io"

#: The configuration format: 3 came with containerd 2.0 (the CRI plugin split in three), 4 with 2.3
#: (the servers' sockets moved from ``[grpc]``/``[ttrpc]`` into their own plugins; a version 4 file
#: with a ``[grpc]`` table silently serves on ``/run/containerd/containerd.sock``). containerd
#: migrates an older version at every start and logs a warning for it, hence the newest the pinned
#: release reads.
CONFIG_VERSION = 4

#: Plugins that would reach outside the node's directory. The btrfs, zfs and devmapper snapshotters
#: and the tracing plugin, which only log errors here, are not even built
#: (:data:`~gpupool.testenv.runtime_tools.CONTAINERD_TAGS`).
DISABLED_PLUGINS = (
    # NRI listens on the host's /var/run/nri/nri.sock: two nodes would fight over it, and no test
    # plugs into NRI.
    "io.containerd.nri.v1.nri",
)

#: The CRI plugin's three sections (configuration version 3 and later).
CRI_RUNTIME = 'plugins."io.containerd.cri.v1.runtime"'
CRI_IMAGES = 'plugins."io.containerd.cri.v1.images"'
CRI_SERVER = 'plugins."io.containerd.grpc.v1.cri"'


@dataclass(frozen=True)
class ContainerdLayout:
    """Where one node's containerd keeps its files (all under ``directory``)."""

    directory: Path

    @property
    def socket(self) -> Path:
        return self.directory / "containerd.sock"

    @property
    def config(self) -> Path:
        return self.directory / "containerd.toml"

    @property
    def root(self) -> Path:
        return self.directory / "root"

    @property
    def state(self) -> Path:
        return self.directory / "state"

    @property
    def temp(self) -> Path:
        """containerd's ``temp`` setting: its ``$TMPDIR``, instead of the host's ``/tmp``."""
        return self.directory / "tmp"

    @property
    def runc_root(self) -> Path:
        return self.directory / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.directory / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        return self.directory / "cni" / "ipam"

    @property
    def cdi_spec_dir(self) -> Path:
        """The only directory containerd reads CDI specs from (a DRA driver writes them here)."""
        return self.directory / "cdi"

    @property
    def opt(self) -> Path:
        return self.directory / "opt"

    def directories(self) -> tuple[Path, ...]:
        """Every directory of the layout that must exist before containerd starts."""
        return (self.root, self.state, self.temp, self.runc_root, self.cni_conf_dir, self.cni_data_dir,
                self.cdi_spec_dir, self.opt)


def render_containerd_config(layout: ContainerdLayout, *, sandbox_image: str, cni_bin_dir: Path,
                             runc: Path) -> str:
    """containerd 2's ``config.toml`` (``version = 4``, :data:`CONFIG_VERSION`) for one test node.

    * ``restrict_oom_score_adj``: root on this machine kind lacks ``CAP_SYS_RESOURCE``; the pause
      container's ``oom_score_adj: -998`` would be refused and runc only says "can't get final
      child's PID from pipe: EOF".
    * ``pinned_images.sandbox``: the locally built pause image (nothing is pulled).
    * ``netns_mounts_under_state_dir``: pod network namespaces under the state directory, not in
      ``/var/run/netns``.
    * ``cdi_spec_dirs``: only :attr:`ContainerdLayout.cdi_spec_dir`, not the host's ``/etc/cdi``
      and ``/var/run/cdi`` (containerd 2 always has CDI on; ``enable_cdi`` is gone).
    * ``BinaryName``: the runc built for the test environment, whatever runc ``$PATH`` has.
    * cgroupfs driver (``SystemdCgroup = false``), as kubelet's ``cgroupDriver``; with kubelet's
      ``cgroupsPerQOS: false`` a pod has no cgroup parent, so a container's cgroup is containerd's
      default ``/k8s.io/<container id>``.
    * ``stream_server_port = "0"``: each node's exec/attach server takes a free port.
    """
    runtime = {
        "restrict_oom_score_adj": True,
        "disable_apparmor": True,
        "enable_selinux": False,
        "netns_mounts_under_state_dir": True,
        "max_container_log_line_size": 16384,
        "cdi_spec_dirs": [str(layout.cdi_spec_dir)],
    }
    runc_options = {"BinaryName": str(runc), "Root": str(layout.runc_root), "SystemdCgroup": False}
    cni = {"bin_dirs": [str(cni_bin_dir)], "conf_dir": str(layout.cni_conf_dir), "max_conf_num": 1}
    tables: list[tuple[str, Mapping[str, Any]]] = [
        ("", {"version": CONFIG_VERSION, "root": str(layout.root), "state": str(layout.state),
              "temp": str(layout.temp), "disabled_plugins": list(DISABLED_PLUGINS), "oom_score": 0}),
        ('plugins."io.containerd.server.v1.grpc"', {"address": str(layout.socket)}),
        ('plugins."io.containerd.server.v1.ttrpc"', {"address": f"{layout.socket}.ttrpc"}),
        ('plugins."io.containerd.internal.v1.opt"', {"path": str(layout.opt)}),
        (CRI_RUNTIME, runtime),
        (f"{CRI_RUNTIME}.containerd", {"default_runtime_name": "runc"}),
        (f"{CRI_RUNTIME}.containerd.runtimes.runc", {"runtime_type": "io.containerd.runc.v2"}),
        (f"{CRI_RUNTIME}.containerd.runtimes.runc.options", runc_options),
        (f"{CRI_RUNTIME}.cni", cni),
        (CRI_IMAGES, {"snapshotter": "overlayfs"}),
        (f"{CRI_IMAGES}.pinned_images", {"sandbox": sandbox_image}),
        (CRI_SERVER, {"disable_tcp_service": True, "stream_server_address": "127.0.0.1",
                      "stream_server_port": "0"}),
    ]
    return "\n".join(_toml_table(name, values) for name, values in tables)


def render_cni_conflist(*, name: str, bridge: str, subnet: str, data_dir: Path) -> str:
    """A bridge + host-local network on a private subnet; no masquerading (no iptables needed).

    containerd adds the loopback interface itself (the ``loopback`` plugin in the same directory).
    """
    conflist = {
        "cniVersion": "0.4.0",
        "name": name,
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": True,
            "ipMasq": False,
            "hairpinMode": False,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(data_dir)},
        }],
    }
    return json.dumps(conflist, indent=2)


def _toml_table(name: str, values: Mapping[str, Any]) -> str:
    """One TOML table of scalars and lists of strings (all this configuration needs)."""
    lines = [f"[{name}]"] if name else []
    lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML here")
