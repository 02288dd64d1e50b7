"""``gpupool node-agent --check``: each verdict from probed facts, the probe over real paths, and
the command's exit code."""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpupool.api.cluster_settings import AGENT_CHECKS_ANNOTATION as CHECKS_ANNOTATION
from gpupool.core.model import GpuCard, Topology
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.isolation.setup import IsolationConfig
from gpupool.nodeagent.selfcheck import (
    Check,
    NodeFacts,
    PathFacts,
    Status,
    checks_annotation,
    exit_code,
    judge,
    render,
    summary,
)
from gpupool.nodeagent.selfcheck_probe import ProbeOptions, library_problem, path_facts, probe

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
    pytest.param({"library_problem": "libgpupool.so: wrong ELF class: ELFCLASS32"}, "enforcement", Status.FAIL,
                 "cannot be loaded: libgpupool.so: wrong ELF class", id="library-not-loadable"),
    pytest.param({"device_gate": (False, "no cgroup2 mount (cgroup v1?)")}, "refusal at open", Status.WARN,
                 "not refused by the kernel", id="no-cgroup-device-programs"),
    pytest.param({"device_gate": (True, "cgroup-device BPF program on cgroup2 at /sys/fs/cgroup")}, "refusal at open",
                 Status.OK, "cgroup2", id="cgroup-device-programs"),
])
def test_each_problem_gets_its_verdict_and_a_hint(change: dict[str, object], name: str, status: Status,
                                                  words: str) -> None:
    checks = {c.name: c for c in judge(replace(HEALTHY, **change))}  # type: ignore[arg-type]
    assert checks[name].status is status and words in checks[name].detail
    assert bool(checks[name].hint) == (status is not Status.OK)
    assert all(c.status is Status.OK for n, c in checks.items() if n != name)


def test_the_summary_counts_and_names_what_is_not_ok() -> None:
    checks = judge(replace(HEALTHY, pod_resources=PathFacts(PODRES.path, False), device_gate=(False, "no cgroup2")))
    text = summary(checks)
    assert text.startswith("5 ok, 1 warn, 1 fail; ")
    assert f"fail pod resources: {PODRES.path}: missing" in text and "warn refusal at open: no cgroup2" in text
    assert summary(judge(HEALTHY)) == "6 ok"
    value = checks_annotation(checks, datetime(2026, 11, 28, 23, 40, tzinfo=UTC))
    assert value == f"2026-11-28T23:40:00Z at start: {text}"


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
                       lambda root: (True, ""), lambda: "", gate=lambda: (True, "cgroup2"), library=lambda p: "x")
        assert failed.cards is None and "DRIVER_NOT_LOADED" in failed.cards_error
        assert "needs --shim-library" in failed.isolation_error
        assert failed.monitor_source == "no card device to watch"
        assert failed.device_gate == (True, "cgroup2") and failed.library_problem == ""  # no library chosen
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
    assert "warn enforcement" in result.output
    assert not any(line.startswith("fail") for line in result.output.splitlines()), result.output


def test_the_probe_loads_the_chosen_library_and_probes_refusal_only_with_the_monitor(tmp_path: Path) -> None:
    library = tmp_path / "libgpupool.so"
    library.write_bytes(b"\x7fELF")
    loaded: list[str] = []

    def load(path: str) -> str:
        loaded.append(path)
        return "undefined symbol: cuInit"

    def gate() -> tuple[bool, str]:
        raise PermissionError("bpf(BPF_PROG_LOAD): Operation not permitted")

    options = ProbeOptions(str(tmp_path), str(tmp_path / "podres.sock"), IsolationConfig("shim", str(library)))
    facts = probe(options, lambda: GpuInventory((), Topology.flat(0), ()), lambda p: None, lambda r: (True, ""),
                  lambda: "", gate=gate, library=load)
    assert loaded == [str(library)] and facts.library_problem == "undefined symbol: cuInit"
    assert facts.device_gate is not None and not facts.device_gate[0]
    assert "Operation not permitted" in facts.device_gate[1]
    assert verdicts(facts)["enforcement"] is Status.FAIL
    quiet = probe(replace(options, usage_monitor=False), lambda: GpuInventory((), Topology.flat(0), ()),
                  lambda p: None, lambda r: (True, ""), lambda: "", gate=gate, library=lambda p: "")
    assert quiet.device_gate is None and "refusal at open" not in verdicts(quiet)
    monitor = {c.name: c for c in judge(quiet)}["usage monitor"]
    assert monitor.status is Status.WARN and monitor.detail.startswith("off (--no-usage-monitor)")


def test_a_library_the_loader_cannot_load_is_named_with_the_loaders_reason(tmp_path: Path) -> None:
    text = tmp_path / "not-elf.so"
    text.write_text("not a library")
    assert library_problem(str(text)) == "not a 64-bit little-endian ELF shared object"
    assert library_problem(str(tmp_path / "gone.so")).startswith("cannot read it")
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64))
    assert library_problem(str(truncated))  # the loader's own words, whatever they are
    libc = next((p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6",
                             "/usr/lib64/libc.so.6") if Path(p).is_file()), None)
    if libc is not None:
        assert library_problem(libc) == ""


def test_a_library_with_a_missing_dependency_is_refused_with_its_name(tmp_path: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the test libraries")
    dependency = tmp_path / "libgpupool_gone.so"
    (tmp_path / "dep.c").write_text("int dep(void) { return 1; }\n")
    (tmp_path / "lib.c").write_text("int dep(void);\nint f(void) { return dep(); }\n")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(dependency), str(tmp_path / "dep.c")], check=True)
    library = tmp_path / "libshim.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(tmp_path / "lib.c"), f"-L{tmp_path}",
                    "-lgpupool_gone"], check=True)
    dependency.unlink()
    assert "libgpupool_gone.so" in library_problem(str(library))


@pytest.mark.slow  # imports the node agent's command
def test_the_agent_logs_its_checks_at_start_and_stops_on_a_failure_when_told(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import click

    from gpupool.cli.node_agent_cmd import _start_checks

    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("model: Fake-T4\ncards:\n  - {memoryMiB: 15360}\n")
    options = ProbeOptions(str(tmp_path / "not-the-plugin-dir"), str(tmp_path / "missing.sock"),
                           IsolationConfig("none"), usage_monitor=False)
    with caplog.at_level(logging.INFO, logger="gpupool.nodeagent.selfcheck"):
        checks = _start_checks(str(gpus), options, exit_on_fail=False)
    assert exit_code(checks) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(m.startswith("start-up check fail device plugins: ") and "-> mount" in m for m in errors), errors
    assert any(r.getMessage().startswith("start-up check ok gpus: 1 card(s): Fake-T4") for r in caplog.records)
    with pytest.raises(click.ClickException, match=r"start-up check failed \(device plugins, pod resources\)"):
        _start_checks(str(gpus), options, exit_on_fail=True)


def test_the_settings_and_the_checks_are_written_on_the_node_in_one_patch_retried_while_the_api_refuses() -> None:
    from gpupool.api.cluster_settings import AGENT_SETTINGS_ANNOTATION, ClusterSettings
    from gpupool.nodeagent.assembly import start_annotations
    from gpupool.nodeagent.options import AgentOptions
    from gpupool.nodeagent.start_annotations import publish_annotations

    calls: list[tuple[str, dict[str, Any]]] = []

    class Api:
        def patch_node(self, name: str, body: dict[str, Any]) -> None:
            calls.append((name, body))
            if len(calls) == 1:
                raise ConnectionError("apiserver away")

    checks = [Check("gpus", Status.OK, "1 card(s): T4"), Check("kubelet", Status.WARN, "missing", "start it")]
    started_with = start_annotations(AgentOptions("gpu-1", cluster=ClusterSettings(), start_checks=checks))
    assert set(started_with) == {AGENT_SETTINGS_ANNOTATION, CHECKS_ANNOTATION}
    assert started_with[CHECKS_ANNOTATION].endswith("at start: 1 ok, 1 warn; warn kubelet: missing")
    assert set(start_annotations(AgentOptions("gpu-1"))) == {AGENT_SETTINGS_ANNOTATION}  # no checks: settings only
    asyncio.run(publish_annotations(Api(), "gpu-1", started_with, first_retry_s=0.01))
    assert calls == [("gpu-1", {"metadata": {"annotations": started_with}})] * 2
