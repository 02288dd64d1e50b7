"""containerd's configuration, the pod network and the namespace script, without running them."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpupool.testenv import runtime_tools
from gpupool.testenv.containerd import DeviceNode, bridge_name, device_prelude, free_subnet
from gpupool.testenv.containerd_config import ContainerdLayout, render_cni_conflist, render_containerd_config
from gpupool.testenv.errors import BuildImpossibleError, StartupError
from gpupool.testenv.gobuild import GoBuild
from gpupool.testenv.mountns import namespace_argv
from gpupool.testenv.versions import CNI_PLUGINS, CONTAINERD, RUNC

RUNC_PATH = Path("/cache/runc-v1/bin/runc")


def render(layout: ContainerdLayout, sandbox_image: str = "gpupool.local/pause:1") -> dict[str, Any]:
    return tomllib.loads(render_containerd_config(layout, sandbox_image=sandbox_image,
                                                  cni_bin_dir=Path("/cache/cni/bin"), runc=RUNC_PATH))


def test_containerd_config_is_current_and_keeps_everything_under_the_node_directory(tmp_path: Path) -> None:
    layout = ContainerdLayout(tmp_path)
    config = render(layout)
    assert config["version"] == 4  # containerd >= 2.3; an older version is migrated at start, with a warning
    assert (config["root"], config["state"], config["temp"]) == (
        str(tmp_path / "root"), str(tmp_path / "state"), str(tmp_path / "tmp"))
    servers = config["plugins"]
    assert "grpc" not in config and "ttrpc" not in config  # version 4 ignores these tables
    assert servers["io.containerd.server.v1.grpc"]["address"] == str(tmp_path / "containerd.sock")
    assert servers["io.containerd.server.v1.ttrpc"]["address"] == str(tmp_path / "containerd.sock.ttrpc")
    assert config["plugins"]["io.containerd.internal.v1.opt"]["path"] == str(tmp_path / "opt")
    assert set(layout.directories()) >= {layout.root, layout.state, layout.temp, layout.cdi_spec_dir}
    assert all(d.is_relative_to(tmp_path) for d in layout.directories())


def test_cri_runtime_section_keeps_the_settings_this_machine_needs(tmp_path: Path) -> None:
    runtime = render(ContainerdLayout(tmp_path))["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True  # root here lacks CAP_SYS_RESOURCE
    assert runtime["netns_mounts_under_state_dir"] is True
    assert runtime["cdi_spec_dirs"] == [str(tmp_path / "cdi")]  # not the host's /etc/cdi
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runtime["containerd"]["default_runtime_name"] == "runc"
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"BinaryName": str(RUNC_PATH), "Root": str(tmp_path / "runc"), "SystemdCgroup": False}
    assert runtime["cni"] == {"bin_dirs": ["/cache/cni/bin"], "conf_dir": str(tmp_path / "cni" / "net.d"),
                              "max_conf_num": 1}


def test_cri_images_section_pins_the_local_sandbox_image(tmp_path: Path) -> None:
    config = render(ContainerdLayout(tmp_path), sandbox_image="gpupool.local/pause:abc")
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"] == {"sandbox": "gpupool.local/pause:abc"}
    assert images["snapshotter"] == "overlayfs"
    assert config["plugins"]["io.containerd.grpc.v1.cri"]["stream_server_port"] == "0"  # nodes side by side


def test_version_2_keys_are_gone(tmp_path: Path) -> None:
    """containerd 2 would convert these (and warn): the file must use the split CRI plugins only."""
    text = render_containerd_config(ContainerdLayout(tmp_path), sandbox_image="p", cni_bin_dir=Path("/c"),
                                    runc=RUNC_PATH)
    for key in ("sandbox_image", "enable_cdi", "bin_dir ", "io.containerd.grpc.v1.cri\".containerd",
                "io.containerd.grpc.v1.cri\".cni"):
        assert key not in text


def test_nri_is_disabled_so_nodes_do_not_share_its_host_socket(tmp_path: Path) -> None:
    assert "io.containerd.nri.v1.nri" in render(ContainerdLayout(tmp_path))["disabled_plugins"]


def test_a_path_with_quotes_stays_one_toml_string(tmp_path: Path) -> None:
    odd = tmp_path / 'a "quoted" dir'
    assert render(ContainerdLayout(odd))["root"] == str(odd / "root")


def test_cni_network_is_a_bridge_without_masquerading(tmp_path: Path) -> None:
    conf = json.loads(render_cni_conflist(name="n", bridge="gpc1", subnet="10.214.3.0/24", data_dir=tmp_path))
    [bridge] = conf["plugins"]
    assert (bridge["type"], bridge["bridge"], bridge["ipMasq"], bridge["isGateway"]) == ("bridge", "gpc1", False, True)
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.214.3.0/24"}]]
    assert bridge["ipam"]["dataDir"] == str(tmp_path)


@pytest.mark.parametrize(("used", "expected"), [
    pytest.param([], "10.214.0.0/24", id="nothing-used"),
    pytest.param(["10.214.0.0/24", "10.214.1.0/24"], "10.214.2.0/24", id="skips-used"),
    pytest.param(["10.214.0.0/23"], "10.214.2.0/24", id="skips-an-overlapping-wider-net"),
    pytest.param(["192.168.0.0/16"], "10.214.0.0/24", id="unrelated"),
])
def test_free_subnet(used: list[str], expected: str) -> None:
    assert free_subnet([ipaddress.IPv4Network(n) for n in used]) == expected


def test_free_subnet_says_when_the_pool_is_full() -> None:
    with pytest.raises(StartupError, match="no free /24"):
        free_subnet([ipaddress.IPv4Network("10.0.0.0/8")])


def test_bridge_names_fit_linux_and_differ_per_node() -> None:
    a, b = bridge_name(Path("/tmp/x/kubelets/a")), bridge_name(Path("/tmp/x/kubelets/b"))
    assert a != b and len(a) <= 15 and a.startswith("gpc")


@pytest.mark.parametrize("path", [
    pytest.param("/tmp/nvidia0", id="outside-dev"),
    pytest.param("/dev", id="dev-itself"),
    pytest.param("/dev/../etc/passwd", id="dot-dot"),
])
def test_stand_in_device_nodes_stay_in_dev(path: str) -> None:
    with pytest.raises(ValueError, match="under /dev"):
        DeviceNode(path, 1, 3)


def test_device_prelude_overlays_dev_and_makes_the_nodes(tmp_path: Path) -> None:
    assert device_prelude(tmp_path, []) == []
    lines = device_prelude(tmp_path, [DeviceNode("/dev/nvidiactl", 1, 3)])
    assert any(line.startswith("mount -t overlay overlay -o lowerdir=/dev,") for line in lines)
    assert lines[-1] == "mknod -m 666 /dev/nvidiactl c 1 3"


def test_namespace_script_binds_every_pair_then_execs(tmp_path: Path) -> None:
    """Ten arguments and more need ``${10}``: plain ``$10`` is ``$1`` followed by a zero."""
    out = tmp_path / "out"
    binds = {Path(f"/src{i}"): Path(f"/dst{i}") for i in range(5)}
    argv = namespace_argv(binds, tmp_path, ["sh", "-c", f'pwd > {out}; echo "$0" >> {out}', "zero"])
    script, args = argv[6], argv[8:]
    fake = script.replace("mount --bind", "echo bind")  # run the script without mounting
    result = subprocess.run(["sh", "-c", fake, "sh", *args], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == [f"bind /src{i} /dst{i}" for i in range(5)]
    assert out.read_text().splitlines() == [str(tmp_path), "zero"]


def test_runtime_tools_refuse_clearly_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_tools, "missing_packages", lambda: ["busybox", "gcc"])
    monkeypatch.setattr(runtime_tools, "missing_builds", lambda: [])
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = runtime_tools.runtime_impossible_reason()
    assert reason is not None and "busybox, gcc missing and not running as root" in reason
    with pytest.raises(BuildImpossibleError, match="not running as root"):
        runtime_tools.ensure_runtime_tools()


def test_runtime_tools_refuse_clearly_without_go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_tools, "missing_packages", lambda: [])
    monkeypatch.setattr(runtime_tools, "missing_builds", lambda: ["containerd-v2.4.2"])
    monkeypatch.setattr(runtime_tools, "toolchain_problem", lambda: "Go not found")
    reason = runtime_tools.runtime_impossible_reason()
    assert reason == "containerd-v2.4.2 not built and cannot be: Go not found"
    with pytest.raises(BuildImpossibleError, match="Go not found"):
        runtime_tools.ensure_runtime_tools()


def test_runtime_tools_install_with_apt_then_build_with_go(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUPOOL_TESTENV_CACHE", str(tmp_path))
    packages, builds = ["busybox"], [spec.key for spec in runtime_tools.go_builds()]
    installed: list[list[str]] = []
    built: list[str] = []
    monkeypatch.setattr(runtime_tools, "missing_packages", lambda: list(packages))
    monkeypatch.setattr(runtime_tools, "missing_builds", lambda: list(builds))
    monkeypatch.setattr(runtime_tools, "toolchain_problem", lambda: None)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(runtime_tools, "_apt_program", lambda name: Path(f"/usr/bin/{name}"))

    def run_step(cmd: list[str], *_: object, **__: object) -> None:
        installed.append(cmd)
        packages.clear()

    def build(spec: GoBuild, **_: object) -> dict[str, Path]:
        assert not packages, "runc's cgo needs gcc from apt before the Go builds"
        built.append(spec.key)
        builds.remove(spec.key)
        return spec.paths()

    monkeypatch.setattr(runtime_tools, "run_step", run_step)
    monkeypatch.setattr(runtime_tools, "build", build)
    tools = runtime_tools.ensure_runtime_tools()
    [cmd] = installed
    assert cmd[:3] == ["apt-get", "install", "-y"]
    assert set(runtime_tools.APT_PACKAGES) <= set(cmd) and "containerd" not in cmd and "runc" not in cmd
    assert built == [f"cni-plugins-{CNI_PLUGINS}", f"runc-{RUNC}", f"containerd-{CONTAINERD}"]
    assert tools.containerd == tmp_path / f"containerd-{CONTAINERD}" / "bin" / "containerd"
    assert tools.shim == tmp_path / f"containerd-{CONTAINERD}" / "bin" / "containerd-shim-runc-v2"
    assert tools.runc == tmp_path / f"runc-{RUNC}" / "bin" / "runc"
    assert tools.cni_bin_dir == tmp_path / f"cni-plugins-{CNI_PLUGINS}" / "bin"
    assert tools.busybox == Path("/usr/bin/busybox")


def test_containerd_is_built_from_its_module_without_cgo_and_useless_snapshotters() -> None:
    spec = runtime_tools.containerd_build()
    assert [p.name for p in spec.programs] == ["containerd", "containerd-shim-runc-v2", "ctr"]
    assert all(p.package.startswith("github.com/containerd/containerd/v2/cmd/") for p in spec.programs)
    assert f"github.com/containerd/containerd/v2 {CONTAINERD}" in spec.go_mod
    assert not spec.cgo and {"no_btrfs", "no_zfs", "no_devmapper"} <= set(spec.tags)
    assert f"version.Version={CONTAINERD}" in spec.ldflags  # `ctr version` names the pinned tag


def test_runc_has_seccomp_because_kubelet_asks_it_for_every_sandbox() -> None:
    spec = runtime_tools.runc_build()
    assert spec.cgo and "seccomp" in spec.tags and "libpathrs" not in spec.tags
    assert {"libseccomp-dev", "pkg-config", "gcc"} <= set(runtime_tools.APT_PACKAGES)
    assert Path("/usr/include/seccomp.h") in runtime_tools.APT_FILES
    assert [(p.name, p.package) for p in spec.programs] == [("runc", "github.com/opencontainers/runc")]
    assert f"github.com/opencontainers/runc {RUNC}" in spec.go_mod


def test_cni_plugins_are_the_three_the_network_uses() -> None:
    spec = runtime_tools.cni_build()
    assert {p.name for p in spec.programs} == {"bridge", "host-local", "loopback"}
    assert f"github.com/containernetworking/plugins {CNI_PLUGINS}" in spec.go_mod and not spec.cgo


def test_containerd_runs_with_the_built_shim_and_runc_first_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/cache/c/bin")
    tools = runtime_tools.RuntimeTools(containerd=Path("/cache/c/bin/containerd"), ctr=Path("/cache/c/bin/ctr"),
                                       runc=Path("/cache/r/bin/runc"), busybox=Path("/bin/busybox"),
                                       gcc=Path("/usr/bin/gcc"), ip=Path("/usr/sbin/ip"),
                                       cni_bin_dir=Path("/cache/n/bin"))
    assert tools.path == "/cache/c/bin:/cache/r/bin:/usr/bin"
    assert tools.shim == Path("/cache/c/bin/containerd-shim-runc-v2")


def test_only_a_static_busybox_counts(tmp_path: Path) -> None:
    """A dynamic busybox (Debian's ``busybox`` package) would not run in the busybox image."""
    assert runtime_tools.is_static_elf(Path("/bin/ls")) is False  # dynamically linked
    text = tmp_path / "script"
    text.write_text("#!/bin/sh\n")
    assert runtime_tools.is_static_elf(text) is False
    static = tmp_path / "static"
    c_source = tmp_path / "main.c"
    c_source.write_text("int main(void) { return 0; }\n")
    if subprocess.run(["gcc", "-static", "-o", str(static), str(c_source)], capture_output=True).returncode != 0:
        pytest.skip("no gcc with a static libc here")
    assert runtime_tools.is_static_elf(static) is True
