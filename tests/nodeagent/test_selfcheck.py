"""``gpupool node-agent --check``: each verdict from probed facts, the probe over real paths, and
the command's exit code."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.core.model import GpuCard, Topology
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.isolation.setup import IsolationConfig
from gpupool.nodeagent.selfcheck import Check, NodeFacts, PathFacts, Status, exit_code, judge, render
from gpupool.nodeagent.selfcheck_probe import ProbeOptions, path_facts, probe

DIR = PathFacts("/var/lib/kubelet/device-plugins", True, is_dir=True, writable=True)
SOCKET = PathFacts("/var/lib/kubelet/device-plugins/kubelet.sock", True, is_socket=True)
PODRES = PathFacts("/var/lib/kubelet/pod-resources/kubelet.sock", True, is_socket=True)
HEALTHY = NodeFacts(cards=("H200", "H200"), cards_error="", plugin_dir=DIR, kubelet_socket=SOCKET,
                    pod_resources=PODRES, isolation="auto: the packaged interception library", isolation_error="",
                    shares=True, enforced=True, monitor_source=None)


def verdicts(facts: NodeFacts) -> dict[str, Status]:
    return {c.name: c.status for c in judge(facts)}


def test_a_healthy_node_passes_every_check() -> None:
    checks = judge(HEALTHY)
    assert [c.status for c in checks] == [Status.OK] * 6 and exit_code(checks) == 0
    assert checks[0].detail == "2 card(s): H200"


@pytest.mark.parametrize(("change", "name", "status", "words"), [
    pytest.param({"cards": None, "cards_error": "NVML_ERROR_LIBRARY_NOT_FOUND"}, "gpus", Status.FAIL,
                 "NVML_ERROR_LIBRARY_NOT_FOUND", id="no-nvml"),
    pytest.param({"cards": ()}, "gpus", Status.WARN, "no cards found", id="no-cards"),
    pytest.param({"plugin_dir": PathFacts(DIR.path, False)}, "device plugins", Status.FAIL, "not a directory",
                 id="plugin-dir-missing"),
    pytest.param({"plugin_dir": replace(DIR, writable=False)}, "device plugins", Status.FAIL, "not writable",
                 id="plugin-dir-read-only"),
    pytest.param({"kubelet_socket": PathFacts(SOCKET.path, False)}, "kubelet", Status.WARN, "missing",
                 id="kubelet-not-running"),
    pytest.param({"pod_resources": PathFacts(PODRES.path, True)}, "pod resources", Status.FAIL, "not a socket",
                 id="pod-resources-not-a-socket"),
    pytest.param({"isolation_error": "--isolation shim needs --shim-library PATH"}, "enforcement", Status.FAIL,
                 "needs --shim-library", id="impossible-isolation"),
    pytest.param({"shares": False, "isolation": "auto: no interception library"}, "enforcement", Status.WARN,
                 "no interception library", id="whole-cards-only"),
    pytest.param({"enforced": False, "isolation": "--isolation none"}, "enforcement", Status.WARN, "--isolation none",
                 id="not-enforced"),
    pytest.param({"monitor_source": "fanotify permission events unavailable"}, "usage monitor", Status.WARN,
                 "the /proc scan runs instead", id="no-fanotify"),
    pytest.param({"checkpoint": PathFacts("/ck", False)}, "checkpoints", Status.WARN, "the agent creates it",
                 id="checkpoints-missing"),
    pytest.param({"checkpoint": PathFacts("/ck", True, True, writable=False)}, "checkpoints", Status.FAIL,
                 "not a writable directory", id="checkpoints-read-only"),
    pytest.param({"checkpoint": PathFacts("/ck", True, True, writable=True),
                  "checkpoint_shared": (False, "checkpoints under /ck on ext4, local to this node")}, "checkpoints",
                 Status.WARN, "local to this node", id="checkpoints-local"),
    pytest.param({"checkpoint": PathFacts("/ck", True, True, writable=True),
                  "checkpoint_shared": (True, "checkpoints under /ck on nfs4")}, "checkpoints", Status.OK, "nfs4",
                 id="checkpoints-shared"),
    pytest.param({"dra_dirs": (PathFacts("/var/run/cdi", False),)}, "dra", Status.FAIL, "/var/run/cdi",
                 id="dra-dir-missing"),
    pytest.param({"remote_server": "no prebuilt GPU server"}, "remote gpu server", Status.FAIL,
                 "no prebuilt GPU server", id="no-remote-server"),
])
def test_each_problem_gets_its_verdict_and_a_hint(change: dict[str, object], name: str, status: Status,
                                                  words: str) -> None:
    checks = {c.name: c for c in judge(replace(HEALTHY, **change))}  # type: ignore[arg-type]
    assert checks[name].status is status and words in checks[name].detail
    assert bool(checks[name].hint) == (status is not Status.OK)
    assert all(c.status is Status.OK for n, c in checks.items() if n != name)


def test_render_puts_the_hint_under_its_check() -> None:
    lines = render([Check("gpus", Status.OK, "2 card(s): H200"), Check("kubelet", Status.WARN, "missing", "start it")])
    assert lines == ["ok   gpus     2 card(s): H200", "warn kubelet  missing", " " * 14 + "-> start it"]


def test_the_probe_reads_real_paths_and_never_raises(tmp_path: Path) -> None:
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    with socket.socket(socket.AF_UNIX) as kubelet, socket.socket(socket.AF_UNIX) as podres:
        kubelet.bind(str(plugins / "kubelet.sock"))
        podres.bind(str(tmp_path / "podres.sock"))
        inventory = GpuInventory((GpuCard(0, "GPU-0", "T4", 15360),), Topology.flat(1), ("/dev/nvidia0",))

        def broken() -> GpuInventory:
            raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

        options = ProbeOptions(str(plugins), str(tmp_path / "podres.sock"), IsolationConfig("none"),
                               lending_checkpoint_dir=str(tmp_path), remote_server=True)
        seen: list[list[str]] = []

        def fanotify(paths: Sequence[str]) -> str | None:
            seen.append(list(paths))
            return None

        facts = probe(options, lambda: inventory, fanotify,
                      lambda root: (True, f"checkpoints under {root} on nfs4"), lambda: "")
        assert seen == [["/dev/nvidia0"]]
        assert facts.cards == ("T4",) and facts.kubelet_socket.is_socket and facts.pod_resources.is_socket
        assert facts.plugin_dir.writable and not facts.enforced and facts.checkpoint_shared is not None
        assert verdicts(facts)["enforcement"] is Status.WARN and facts.remote_server == ""
        failed = probe(replace(options, isolation=IsolationConfig("shim")), broken, lambda p: None,
                       lambda root: (True, ""), lambda: "")
        assert failed.cards is None and "DRIVER_NOT_LOADED" in failed.cards_error
        assert "needs --shim-library" in failed.isolation_error
        assert failed.monitor_source == "no card device to watch"
    assert path_facts(str(tmp_path / "gone")) == PathFacts(str(tmp_path / "gone"), exists=False)


@pytest.mark.slow  # imports the node agent's command
def test_the_command_exits_1_on_a_failed_check_and_0_otherwise(tmp_path: Path) -> None:
    from gpupool.cli.main import cli

    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("model: Fake-T4\ncards:\n  - {memoryMiB: 15360}\n")
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    args = ["node-agent", "--check", "--fake-gpus", str(gpus), "--plugin-dir", str(plugins), "--isolation", "none"]
    result = CliRunner().invoke(cli, [*args, "--pod-resources-socket", str(tmp_path / "missing.sock")])
    assert result.exit_code == 1, result.output
    assert "fail pod resources" in result.output and "ok   gpus" in result.output
    with socket.socket(socket.AF_UNIX) as podres:
        podres.bind(str(tmp_path / "podres.sock"))
        result = CliRunner().invoke(cli, [*args, "--pod-resources-socket", str(tmp_path / "podres.sock")])
    assert result.exit_code == 0, result.output
    assert "warn enforcement" in result.output and "fail" not in result.output
