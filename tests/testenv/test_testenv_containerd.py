"""containerd's configuration, the pod network and the namespace script, without running them."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from gpupool.testenv import runtime_tools
from gpupool.testenv.containerd import DeviceNode, bridge_name, device_prelude, free_subnet
from gpupool.testenv.containerd_config import ContainerdLayout, render_cni_conflist, render_containerd_config
from gpupool.testenv.errors import BuildImpossibleError, StartupError
from gpupool.testenv.mountns import namespace_argv

CRI = 'plugins."io.containerd.grpc.v1.cri"'


def test_containerd_config_keeps_everything_under_the_node_directory(tmp_path: Path) -> None:
    layout = ContainerdLayout(tmp_path)
    config = tomllib.loads(render_containerd_config(layout, sandbox_image="gpupool.local/pause:1",
                                                    cni_bin_dir=Path("/usr/lib/cni")))
    assert config["version"] == 2
    assert (config["root"], config["state"], config["grpc"]["address"]) == (
        str(tmp_path / "root"), str(tmp_path / "state"), str(tmp_path / "containerd.sock"))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "gpupool.local/pause:1"
    assert cri["restrict_oom_score_adj"] is True  # root here lacks CAP_SYS_RESOURCE
    assert cri["netns_mounts_under_state_dir"] is True
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"Root": str(tmp_path / "runc"), "SystemdCgroup": False}
    assert cri["cni"]["conf_dir"] == str(tmp_path / "cni" / "net.d")
    assert config["plugins"]["io.containerd.internal.v1.opt"]["path"] == str(tmp_path / "opt")


def test_a_path_with_quotes_stays_one_toml_string(tmp_path: Path) -> None:
    odd = tmp_path / 'a "quoted" dir'
    config = tomllib.loads(render_containerd_config(ContainerdLayout(odd), sandbox_image="p",
                                                    cni_bin_dir=Path("/usr/lib/cni")))
    assert config["root"] == str(odd / "root")


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
    monkeypatch.setattr(runtime_tools, "missing_programs", lambda: ["containerd", "runc"])
    monkeypatch.setattr(runtime_tools.os, "geteuid", lambda: 1000)
    reason = runtime_tools.runtime_impossible_reason()
    assert reason is not None and "containerd, runc missing and not running as root" in reason
    with pytest.raises(BuildImpossibleError, match="not running as root"):
        runtime_tools.ensure_runtime_tools()


def test_runtime_tools_install_with_apt_when_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUPOOL_TESTENV_CACHE", str(tmp_path))
    installed: list[list[str]] = []
    missing = [["containerd"]]
    monkeypatch.setattr(runtime_tools, "missing_programs", lambda: missing[-1])
    monkeypatch.setattr(runtime_tools.os, "geteuid", lambda: 0)
    monkeypatch.setattr(runtime_tools.shutil, "which", lambda name: f"/usr/bin/{name}")

    def run_step(cmd: list[str], *_: object, **__: object) -> None:
        installed.append(cmd)
        missing.append([])

    monkeypatch.setattr(runtime_tools, "run_step", run_step)
    monkeypatch.setattr(runtime_tools, "_program", lambda name: Path(f"/usr/bin/{name}"))
    tools = runtime_tools.ensure_runtime_tools()
    assert tools.containerd == Path("/usr/bin/containerd")
    [cmd] = installed
    assert cmd[:3] == ["apt-get", "install", "-y"]
    assert {"containerd", "runc", "containernetworking-plugins", "busybox-static"} <= set(cmd)


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
