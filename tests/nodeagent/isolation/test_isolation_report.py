"""What the node reports: per card the backend that enforces its shares, per container the processes
that registered (a real child process registering through the agent's own socket)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api import environment as env
from gpupool.api.lending import LendingNames
from gpupool.api.shim_contract import RegisterRequest
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime
from gpupool.nodeagent.isolation.backends import Enforcement
from gpupool.nodeagent.isolation.report import isolation_table
from gpupool.nodeagent.isolation.shim_backend import ShimEnforcement
from gpupool.nodeagent.isolation.shim_files import ShimLayout
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry
from gpupool.nodeagent.lending.checkpoint import CheckpointEnforcement, CheckpointStore
from gpupool.nodeagent.lending.pods import LendingPods
from gpupool.nodeagent.metrics import metrics_app
from gpupool.testing.node_workload import generate
from tests.nodeagent.harness import fake_pod, running_node
from tests.nodeagent.isolation.shim_client import registered_child


async def scrape(agent: NodeAgent) -> str:
    async with TestClient(TestServer(metrics_app(agent))) as client:
        response = await client.get("/metrics")
        assert response.status == 200
        return await response.text()


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


@pytest.mark.slow
@pytest.mark.parametrize("lending", [pytest.param(False, id="shim"),
                                     pytest.param(True, id="shim-wrapped-by-lending-checkpoints")])
def test_metrics_and_usage_show_the_backend_and_registered_processes(lending: bool) -> None:
    gpu_file, pods = generate(3, cards=2, seed=2)
    state = Path(tempfile.mkdtemp(prefix="gs", dir="/tmp"))  # short: the socket lives below it
    library = state / "lib.so"
    library.write_bytes(b"\x7fELF")
    registry = ShimRegistry(lambda _: CgroupIdentity(Runtime.UNKNOWN))
    shim = ShimEnforcement(str(library), ShimLayout(str(state)), registry)
    enforcement: Enforcement = shim
    if lending:  # --lending wraps the backend; the report must still see the registrations
        enforcement = CheckpointEnforcement(shim, CheckpointStore(str(state / "ckpt")),
                                            LendingPods(LendingNames()).get)

    async def main() -> None:
        async with running_node(gpu_file, [p.json for p in pods], seed=2, enforcement=enforcement) as node:
            await node.kubelet.handle_pod_additions([fake_pod(p.json) for p in pods])
            await node.kubelet.wait_idle()
            fake = next(iter(node.kubelet.pod_manager.values()))
            cname, run = next(iter(fake.runs.items()))
            request = RegisterRequest(run.envs[env.SHIM_TOKEN], 1, f"{fake.namespace}/{fake.name}", cname)

            def register_and_read() -> tuple[bool, str, str]:
                with registered_child(shim.layout.socket, request) as (_child, reply):
                    text = asyncio.run_coroutine_threadsafe(scrape(node.agent), loop).result(10)
                    return reply.ok, text, isolation_table(node.agent)

            loop = asyncio.get_running_loop()
            ok, text, table = await asyncio.to_thread(register_and_read)
            assert ok
            backends = samples(text, "gpupool_card_isolation_backend")
            assert {(labels["card"], labels["backend"]) for labels, value in backends if value == 1} == {
                ("0", "shim"), ("1", "shim")}
            assert len(backends) == 2 * 3  # every card, every backend: 1 for the one in force
            assert [v for _, v in samples(text, "gpupool_card_isolation_enforced")] == [1.0, 1.0]
            registered = {(labels["pod"], labels["container"]): value
                          for labels, value in samples(text, "gpupool_container_registered_processes")}
            assert registered[(fake.name, cname)] == 1
            assert sum(registered.values()) == 1
            assert samples(text, "gpupool_shim_registrations_accepted_total") == [({}, 1.0)]
            assert f"{fake.namespace}/{fake.name}/{cname}" in table and "shim" in table
            row = next(line for line in table.splitlines() if f"{fake.name}/{cname}" in line)
            assert row.split()[1:] == ["1", "0"]  # registered processes, heartbeat age (just registered)
            ages = {labels["pod"]: value for labels, value in samples(text, "gpupool_container_heartbeat_age_seconds")}
            assert ages[fake.name] < 5

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.slow
def test_a_node_without_enforcement_says_so_per_card() -> None:
    gpu_file, _ = generate(1, cards=2, seed=2)

    async def main() -> None:
        async with running_node(gpu_file) as node:
            text = await scrape(node.agent)
            table = isolation_table(node.agent)
        in_force = {labels["card"]: labels["backend"]
                    for labels, value in samples(text, "gpupool_card_isolation_backend") if value == 1}
        assert in_force == {"0": "none", "1": "none"}
        assert [v for _, v in samples(text, "gpupool_card_isolation_enforced")] == [0.0, 0.0]
        assert not samples(text, "gpupool_container_registered_processes")
        assert "no enforcement backend on this node" in table

    asyncio.run(main())
