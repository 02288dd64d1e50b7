"""What the control center sees of a node carries no process names, command lines, environment, host
paths or pids (docs/monitor.md, "What the control center sees").

Real processes with tell-tale command lines, environments and names (``/proc/<pid>/comm``) hold
stand-in device files under a host directory with a tell-tale name; the real usage monitor (the
/proc scan) records them, the fake NVML backend reports their memory, one registered with the
interception library's registry, another holds a card it was not granted (a live risk), and the
isolation backend's detail names a host path and a pid, as real ones do. Every page the agent serves
(``/metrics``, ``/usage``, ``/usage.json``) is then searched for each of them.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.shim_contract import RegisterRequest
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime
from gpupool.nodeagent.isolation.backends import EnforcementState, IsolationBackend
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry
from gpupool.nodeagent.metrics import metrics_app
from gpupool.nodeagent.monitor.proc_scan_source import ProcScanSource
from gpupool.nodeagent.monitor.service import MonitorConfig, UsageMonitor
from gpupool.nodeagent.monitor.source_selector import SourceChoice
from gpupool.nodeagent.monitor.usage_state import ProcessIdentity
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.risk.findings import RiskAction, RiskKind
from gpupool.nodeagent.risk.metrics import RiskCollector
from gpupool.nodeagent.risk.responder import RiskResponder
from gpupool.nodeagent.risk.service import RiskMonitor
from gpupool.nodeagent.usage_monitor import BackendSampler, card_paths
from tests.nodeagent.harness import NAMES
from tests.nodeagent.risk.test_risk_live import wait_for_holder
from tests.nodeagent.usage_world import GPUS, NODE, Pods

ARGV_SECRET = "--api-key=argv-secret-5e1f"
ENV_SECRET = "env-secret-5e1f"
COMM_SECRET = "commsecret5e1f"  # at most 15 characters: the kernel's limit for a task's name
HOST_DIR = "host-secret-dir-5e1f"
TOKEN = "ab" * 32

_HOLD = (
    "import os, sys\n"
    f"open('/proc/self/comm', 'w').write({COMM_SECRET!r})\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
    "print('opened', flush=True)\n"
    "sys.stdin.readline()\n"
)


def holder(path: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", _HOLD, str(path), ARGV_SECRET], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={"DB_PASSWORD": ENV_SECRET, "PATH": "/usr/bin"})
    assert child.stdout is not None and child.stdout.readline().strip() == "opened"
    return child


@dataclass
class ShimEnforcing:
    """The library's backend as the report sees it; its detail names a host path and a pid, as the
    real backends' do (a library that went missing, an MPS daemon)."""

    registry: ShimRegistry
    detail: str

    def state(self) -> EnforcementState:
        return EnforcementState(IsolationBackend.SHIM, True, self.detail)


def label_values(text: str) -> set[str]:
    return {value for family in text_string_to_metric_families(text) for s in family.samples
            for value in s.labels.values()}


def json_values(doc: Any) -> list[Any]:
    if isinstance(doc, dict):
        return [v for value in doc.values() for v in json_values(value)]
    if isinstance(doc, list):
        return [v for value in doc for v in json_values(value)]
    return [doc]


def test_no_process_name_argv_environment_host_path_or_pid_reaches_usage_or_metrics(tmp_path: Path) -> None:
    host = tmp_path / HOST_DIR
    host.mkdir()
    for index in (0, 1):
        (host / f"nvidia{index}").write_text("stand-in for a GPU device node\n")
    trainer, rogue = holder(host / "nvidia0"), holder(host / "nvidia1")
    pids = {trainer.pid, rogue.pid}
    who = {trainer.pid: ProcessIdentity("c-train", "train", "job-0", "ml"),
           rogue.pid: ProcessIdentity("c-rogue", "x", "rogue", "ml")}
    try:
        backend = FakeGpuBackend.from_dict({**GPUS, "devicePathPrefix": str(host / "nvidia"), "usage": [
            {"at": 0, "card": 0, "utilization": 50, "processes": [{"pid": trainer.pid, "memoryMiB": 3000, "sm": 40}]},
            {"at": 0, "card": 1, "utilization": 10, "processes": [{"pid": rogue.pid, "memoryMiB": 700}]}]})
        monitor = UsageMonitor(NODE, card_paths(backend.inventory()), (), BackendSampler(backend),
                               MonitorConfig(str(host / "state.json")),
                               choose=lambda paths: SourceChoice(ProcScanSource(paths, interval=0.05), "test"),
                               identify=lambda pid: who.get(pid, ProcessIdentity()))
        registry = ShimRegistry(lambda _pid: CgroupIdentity(Runtime.UNKNOWN, reason="a test process"))
        registry.issue(TOKEN, "uid-0", "train", "ml", "job-0")
        assert registry.register(RegisterRequest(TOKEN, 1, "ml/job-0", "train"), trainer.pid).ok
        enforcement = ShimEnforcing(registry, f"library {host}/libgpupool-shim.so checked; mps daemon pid "
                                              f"{trainer.pid}")
        pods = Pods()
        agent = NodeAgent(NODE, NAMES, backend, pods, pods, lambda *a: "", monitor=monitor,
                          enforcement=enforcement)  # type: ignore[arg-type]
        posted: list[str] = []

        async def post(_namespace: str, _pod: str, _reason: str, message: str) -> None:
            posted.append(message)

        risks = RiskMonitor(agent, monitor, RiskResponder(RiskAction.REPORT, post), grace_s=0)
        monitor.start()

        async def pages() -> dict[str, str]:
            await agent.pre_start("", [])
            for pid, path in ((trainer.pid, host / "nvidia0"), (rogue.pid, host / "nvidia1")):
                await asyncio.to_thread(wait_for_holder, monitor, str(path), pid)
            await monitor.step()
            found = await risks.step()
            assert [(r.kind, r.pod) for r in found] == [(RiskKind.UNGRANTED_CARD, "rogue")]
            async with TestClient(TestServer(metrics_app(agent, [RiskCollector(risks)]))) as client:
                return {page: await (await client.get(page)).text() for page in ("/metrics", "/usage", "/usage.json")}

        try:
            served = asyncio.run(pages())
        finally:
            monitor.stop()
    finally:
        for child in (trainer, rogue):
            child.kill()
            child.wait()
    # what the pages are for is there: the containers, their figures, the registration, the risk
    assert "ml/job-0/train" in served["/usage"] and "3000/4096" in served["/usage"] and "ml/rogue/x" in served["/usage"]
    assert 'gpupool_container_registered_processes{container="train"' in served["/metrics"]
    assert 'gpupool_risk_active{kind="ungranted-card",node="node-a"} 1.0' in served["/metrics"]
    # and nothing else: the secrets of the processes and of the host
    assert any(str(rogue.pid) in message for message in posted)  # the pod's event names the pid (the admin's)
    for page, text in served.items():
        for secret in (ARGV_SECRET, "argv-secret", ENV_SECRET, COMM_SECRET, "python", HOST_DIR, str(tmp_path)):
            assert secret not in text, f"{page} shows {secret!r}"
        for pid in pids:
            assert not re.search(rf"(?<![\d.]){pid}(?![\d.])", text), f"{page} shows pid {pid}"
    assert not pids & {value for value in label_values(served["/metrics"])}
    assert not pids & set(json_values(json.loads(served["/usage.json"])))
    rows = {row["pod"]: row for row in json.loads(served["/usage.json"])["containers"]}
    assert rows["job-0"]["heartbeatStale"] is False and "heartbeatAgeSeconds" in rows["job-0"]  # registered
    assert "heartbeatAgeSeconds" not in rows["rogue"]  # never registered: no heartbeat to show
    assert "<path>" in served["/usage"] and "pid ?" in served["/usage"]  # the backend's detail, de-sensitised
