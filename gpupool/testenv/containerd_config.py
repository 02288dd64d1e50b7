"""Pure renderers of containerd's configuration and the CNI network of a test node (no I/O).

Every path containerd would write by default (``/var/lib/containerd``, ``/run/containerd``,
``/opt/containerd``, runc's state, the network namespaces, the CNI leases) is moved under the
node's own directory, so several nodes run side by side and stopping one deletes one directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: containerd's namespace for everything the CRI plugin (that is, kubelet) creates.
K8S_NAMESPACE = "k8s.io"

#: Snapshotters that cannot work here (or at all on this kernel) and only log errors at start.
DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.internal.v1.tracing",
)


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
    def runc_root(self) -> Path:
        return self.directory / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.directory / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        return self.directory / "cni" / "ipam"

    @property
    def opt(self) -> Path:
        return self.directory / "opt"


def render_containerd_config(layout: ContainerdLayout, *, sandbox_image: str, cni_bin_dir: Path) -> str:
    """containerd 1.6's ``config.toml`` (version 2) for one test node.

    * ``restrict_oom_score_adj``: root on this machine kind lacks ``CAP_SYS_RESOURCE``; the pause
      container's ``oom_score_adj: -998`` would be refused and runc only says "can't get final
      child's PID from pipe: EOF".
    * ``sandbox_image``: the locally built pause image (nothing is pulled).
    * ``netns_mounts_under_state_dir``: pod network namespaces under the state directory, not in
      ``/var/run/netns``.
    * cgroupfs driver (``SystemdCgroup = false``), as kubelet's ``cgroupDriver``: a container's
      cgroup is then ``/k8s.io/<container id>``.
    """
    cri = {
        "sandbox_image": sandbox_image,
        "restrict_oom_score_adj": True,
        "disable_apparmor": True,
        "enable_selinux": False,
        "netns_mounts_under_state_dir": True,
        "max_container_log_line_size": 16384,
    }
    runc_options = {"Root": str(layout.runc_root), "SystemdCgroup": False}
    cni = {"bin_dir": str(cni_bin_dir), "conf_dir": str(layout.cni_conf_dir), "max_conf_num": 1}
    tables: list[tuple[str, Mapping[str, Any]]] = [
        ("", {"version": 2, "root": str(layout.root), "state": str(layout.state),
              "disabled_plugins": list(DISABLED_PLUGINS), "oom_score": 0}),
        ("grpc", {"address": str(layout.socket)}),
        ("ttrpc", {"address": f"{layout.socket}.ttrpc"}),
        ('plugins."io.containerd.internal.v1.opt"', {"path": str(layout.opt)}),
        ('plugins."io.containerd.grpc.v1.cri"', cri),
        ('plugins."io.containerd.grpc.v1.cri".containerd',
         {"snapshotter": "overlayfs", "default_runtime_name": "runc"}),
        ('plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc',
         {"runtime_type": "io.containerd.runc.v2"}),
        ('plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options', runc_options),
        ('plugins."io.containerd.grpc.v1.cri".cni', cni),
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
