"""The usage monitor's per-container rows and series know DRA containers (issue 24): a container whose
share came from a claim the driver prepared shows its claim's memory and compute next to what its
processes use, on ``/usage``, ``/usage.json`` and the ``gpupool_container_*`` series, as an
extended-resource container shows its assignment's. The claims come from a real :class:`ClaimState`
prepared through kubelet's call; the pods go through the agent's own pod reading (``resources.claims``
resolved through ``resourceClaims`` and ``resourceClaimStatuses``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gpupool.api.usage_report import decode_usage_report
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.dra.cdi import CdiSpecs
from gpupool.nodeagent.dra.claim_allocation import ClaimRef
from gpupool.nodeagent.dra.claim_state import ClaimState
from gpupool.nodeagent.isolation.shim_registry import Heartbeat
from gpupool.nodeagent.metrics import metrics_app
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind
from gpupool.nodeagent.monitor.service import MonitorConfig, UsageMonitor
from gpupool.nodeagent.monitor.source_selector import SourceChoice
from gpupool.nodeagent.monitor.usage_state import ProcessIdentity
from gpupool.nodeagent.nvml.backend import CONTROL_DEVICES
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.pod_view import pod_view_from_json
from gpupool.nodeagent.types import PodResourcesSnapshot, PodView
from gpupool.nodeagent.usage_monitor import BackendSampler, card_paths
from gpupool.nodeagent.usage_report import container_rows, usage_report
from tests.nodeagent.dra.test_one_ledger_agrees import DRIVER, NODE, claim
from tests.nodeagent.harness import NAMES
from tests.nodeagent.monitor.fake_processes import FakeProcesses
from tests.nodeagent.monitor.scripted_source import ScriptedSource
from tests.nodeagent.test_usage_metrics import samples

MIB = 1 << 20
GPUS = {"model": "Tesla-T4", "cards": [{"uuid": "GPU-0", "memoryMiB": 16384}, {"uuid": "GPU-1", "memoryMiB": 16384}],
        "usage": [{"at": 0, "card": 1, "utilization": 30,
                   "processes": [{"pid": 300, "memoryMiB": 2000, "sm": 25}, {"pid": 301, "memoryMiB": 700, "sm": 5}]},
                  {"at": 0, "card": 0, "utilization": 10, "processes": [{"pid": 400, "memoryMiB": 1000, "sm": 10}]}]}
WHO = {300: ProcessIdentity("c-main", "main", "infer", "ns"), 301: ProcessIdentity("c-side", "side", "infer", "ns"),
       400: ProcessIdentity("c-tpl", "app", "tpl", "ns")}
"""pid 300: the container using the claim; 301: its pod's other container, which uses none; 400: a
container of a pod whose claim was made from a template."""


def dra_pod(name: str, claims: Mapping[str, str], uses: Mapping[str, Sequence[str]],
            generated: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A running pod on NODE without extended resources: ``claims`` its ``resourceClaims`` (entry →
    ResourceClaim name, or ``""`` for one from a template, named by ``generated``), ``uses`` each
    container's ``resources.claims`` entries."""
    entries = [{"name": entry, "resourceClaimName": real} if real else
               {"name": entry, "resourceClaimTemplateName": f"{entry}-template"} for entry, real in claims.items()]
    containers = [{"name": c, "resources": {"claims": [{"name": e} for e in used]} if used else {}}
                  for c, used in uses.items()]
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
            "spec": {"nodeName": NODE, "resourceClaims": entries, "containers": containers},
            "status": {"phase": "Running", "resourceClaimStatuses": [
                {"name": entry, "resourceClaimName": real} for entry, real in (generated or {}).items()]}}


PODS = (dra_pod("infer", {"gpu": "infer-gpu"}, {"main": ["gpu"], "side": []}),
        dra_pod("tpl", {"gpu": ""}, {"app": ["gpu"]}, generated={"gpu": "tpl-gpu-x7k2p"}))


class Pods:
    """The pod source and PodResources of the DRA pods."""

    def __init__(self) -> None:
        self.views = {view.key: view for view in (pod_view_from_json(p, NAMES) for p in PODS)}

    async def get(self, namespace: str, name: str) -> PodView | None:
        return self.views.get((namespace, name))

    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        pass

    async def list(self) -> PodResourcesSnapshot:
        return {key: {} for key in self.views}


async def prepared_claims(tmp: Path, backend: FakeGpuBackend) -> ClaimState:
    """infer-gpu: 4 GiB and 30 % of card 1; tpl-gpu-x7k2p: card 0 whole; prepared as kubelet asks."""
    objects = {"infer-gpu": claim("infer-gpu", [(1, 4096, 30)]),
               "tpl-gpu-x7k2p": claim("tpl-gpu-x7k2p", [(0, None, 0)])}

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        return objects.get(name)

    state = ClaimState(NODE, DRIVER, backend.inventory, read, CdiSpecs(str(tmp / "cdi"), "gpupool.io"),
                       str(tmp / "claims.json"))
    refs = [ClaimRef("ns", name, obj["metadata"]["uid"]) for name, obj in objects.items()]
    answers = await state.prepare(refs)
    assert not any(isinstance(a, str) for a in answers.values()), answers
    return state


async def dra_node(tmp: Path, opened: bool = True) -> tuple[NodeAgent, UsageMonitor]:
    """An agent with the driver's claims whose monitor has recorded pids 300 and 301 on card 1 and 400
    on card 0 (none with ``opened`` false), and sampled once."""
    backend = FakeGpuBackend.from_dict(GPUS, clock=lambda: 50.0)
    source, processes = ScriptedSource(), FakeProcesses()

    def choose(paths: Sequence[str]) -> SourceChoice:
        return SourceChoice(source, "test")

    monitor = UsageMonitor(NODE, card_paths(backend.inventory()), CONTROL_DEVICES, BackendSampler(backend),
                           MonitorConfig(str(tmp / "state.json")), choose=choose, processes=processes,
                           identify=lambda pid: WHO[pid], clock=lambda: 50.0,
                           ignore_pids=())  # pid 400 may be this process's own
    monitor.start()
    for pid, path in ((300, "/dev/nvidia1"), (301, "/dev/nvidia1"), (400, "/dev/nvidia0")) if opened else ():
        processes.spawn(pid, path)
        source.emit(DeviceEvent(EventKind.OPEN, path, pid, 40.0))
    pods = Pods()
    state = await prepared_claims(tmp, backend)
    agent = NodeAgent(NODE, NAMES, backend, pods, pods, lambda *a: "", monitor=monitor,
                      claims_granted=state.as_pods)
    await agent.pre_start("", [])
    await monitor.step()
    return agent, monitor


def labels(pod: str, container: str, card: int) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"node": NODE, "namespace": "ns", "pod": pod, "container": container,
                         "card": str(card)}.items()))


def test_a_claims_container_has_its_claims_limits_on_every_page(tmp_path: Path) -> None:
    """Before, the rows read only the pods' assignments: a DRA container showed limit 0 and no share,
    as a process holding a card without any grant."""
    async def main() -> tuple[str, str, str]:
        agent, monitor = await dra_node(tmp_path)
        try:
            async with TestClient(TestServer(metrics_app(agent))) as client:
                return (await (await client.get("/metrics")).text(), await (await client.get("/usage")).text(),
                        await (await client.get("/usage.json")).text())
        finally:
            monitor.stop()

    text, table, doc = asyncio.run(main())
    got = samples(text)
    main_, side, tpl = labels("infer", "main", 1), labels("infer", "side", 1), labels("tpl", "app", 0)
    assert got["gpupool_container_memory_limit_bytes"] == {main_: 4096 * MIB, side: 0, tpl: 16384 * MIB}
    assert got["gpupool_container_compute_share_ratio"] == {main_: 0.3, side: 0, tpl: 0}
    assert got["gpupool_container_memory_used_bytes"] == {main_: 2000 * MIB, side: 700 * MIB, tpl: 1000 * MIB}
    assert got["gpupool_container_sm_utilization_ratio"] == {main_: 0.25, side: 0.05, tpl: 0.1}
    rows = {(r.pod, r.container, r.card): r for r in decode_usage_report(doc).containers}
    assert set(rows) == {("infer", "main", 1), ("infer", "side", 1), ("tpl", "app", 0)}
    main_row, side_row = rows[("infer", "main", 1)], rows[("infer", "side", 1)]
    assert (main_row.memory_used_mib, main_row.memory_limit_mib, main_row.sm_percent,
            main_row.compute_share_percent, main_row.processes, main_row.claims) == (2000, 4096, 25, 30, 1,
                                                                                    ("infer-gpu",))
    assert (side_row.memory_limit_mib, side_row.claims) == (0, ())  # its pod's claim is not its grant
    assert (rows[("tpl", "app", 0)].memory_limit_mib, rows[("tpl", "app", 0)].claims) == (16384, ("tpl-gpu-x7k2p",))
    line = next(line for line in table.splitlines() if line.startswith("ns/infer/main"))
    assert "2000/4096" in line and "25/30" in line and line.endswith("infer-gpu")
    assert next(line for line in table.splitlines() if line.startswith("ns/infer/side")).endswith(" -")


def test_a_claim_prepared_but_not_held_is_a_row_of_its_container(tmp_path: Path) -> None:
    """A container using a claim shows its grant before its processes open the card, like an
    assignment's container (limits, nothing used); without the driver's claims it has no row."""
    async def main() -> tuple[set[tuple[str, str, int, int, int]], set[tuple[str, str, int]]]:
        agent, monitor = await dra_node(tmp_path, opened=False)
        try:
            with_claims = container_rows(NODE, monitor, agent.inventory, agent.listed_pods(), agent.prepared_claims())
            without = container_rows(NODE, monitor, agent.inventory, agent.listed_pods())
            return ({(r.pod, r.container, r.card, r.memory_limit_mib, r.processes) for r in with_claims},
                    {(r.pod, r.container, r.card) for r in without})
        finally:
            monitor.stop()

    granted, without = asyncio.run(main())
    assert granted == {("infer", "main", 1, 4096, 0), ("tpl", "app", 0, 16384, 0)}
    assert without == set()


def test_a_claims_container_carries_its_claims_heartbeat(tmp_path: Path) -> None:
    """The interception library registers a claim's processes under the claim's name
    (GPUPOOL_CONTAINER); the container using it carries that heartbeat in ``/usage.json``."""
    async def main() -> dict[tuple[str, str], tuple[float | None, bool | None]]:
        agent, monitor = await dra_node(tmp_path)
        try:
            beats = {("ns", "infer", "infer-gpu"): Heartbeat(1, 42.0, True),
                     ("ns", "tpl", "app"): Heartbeat(1, 2.0, False),  # its own registration wins
                     ("ns", "tpl", "tpl-gpu-x7k2p"): Heartbeat(1, 9.0, False)}
            report = usage_report(NODE, monitor, agent.inventory, agent.listed_pods(), beats,
                                  claims=agent.prepared_claims())
            return {(r.pod, r.container): (r.heartbeat_age_seconds, r.heartbeat_stale) for r in report.containers}
        finally:
            monitor.stop()

    assert asyncio.run(main()) == {("infer", "main"): (42.0, True), ("infer", "side"): (None, None),
                                   ("tpl", "app"): (2.0, False)}
