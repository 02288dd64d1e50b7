"""Allocate with the library backend, through the fake kubelet: every container gets its own token
and directory, identical in every resource's response (kubelet merges them), and nothing else
about the grant changes."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from gpupool.api import environment as env
from gpupool.api.shim_contract import (
    CONTAINER_GRANT_DIR,
    CONTAINER_REGION_PATH,
    TOKEN_FILE,
    decode_grant,
)
from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime
from gpupool.nodeagent.isolation.shim_backend import ShimEnforcement
from gpupool.nodeagent.isolation.shim_files import ShimLayout
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry
from gpupool.testing.node_workload import generate
from tests.nodeagent.container_env import check_container_env
from tests.nodeagent.harness import fake_pod, running_node

CONTAINER_PATHS = {"/usr/local/gpupool/lib/libgpupool-shim.so", "/etc/ld.so.preload", "/etc/gpupool",
                   "/var/run/gpupool/memory.region", "/var/run/gpupool-agent"}


@pytest.mark.slow
def test_concurrent_admission_gives_each_container_its_own_exact_mounts(tmp_path: Path) -> None:
    gpu_file, pods = generate(60, cards=4, seed=5)
    uuids = {i: c["uuid"] for i, c in enumerate(gpu_file["cards"])}
    library = tmp_path / "libgpupool-shim.so"
    library.write_bytes(b"\x7fELF")
    state = tmp_path / "state"
    shim = ShimEnforcement(str(library), ShimLayout(str(state)),
                           ShimRegistry(lambda _: CgroupIdentity(Runtime.UNKNOWN)))
    rng = random.Random(5)

    async def main() -> None:
        async with running_node(gpu_file, [p.json for p in pods], seed=5, enforcement=shim) as node:
            k = node.kubelet
            order = list(pods)
            rng.shuffle(order)
            batches = [order[i:i + 7] for i in range(0, len(order), 7)]
            await asyncio.gather(*(k.handle_pod_additions([fake_pod(p.json) for p in b]) for b in batches))
            await k.wait_idle(60)
            fakes = {(p.namespace, p.name): p for p in k.pod_manager.values()}
            assert all(p.phase == "Running" for p in fakes.values())
            assert sum(check_container_env(p, fakes[p.key], uuids) for p in pods) > 60
            tokens: set[str] = set()
            for p in pods:
                fake = fakes[p.key]
                for a in p.placement.containers:
                    run = fake.runs[a.container]
                    assert not run.conflicts, run.conflicts
                    assert set(run.mounts) == CONTAINER_PATHS, run.mounts
                    host_dir, read_only = run.mounts[CONTAINER_GRANT_DIR]
                    assert (host_dir, read_only) == (str(state / "containers" / f"{fake.uid}_{a.container}"), True)
                    assert run.mounts[CONTAINER_REGION_PATH] == (f"{host_dir}/memory.region", False)
                    token = run.envs[env.SHIM_TOKEN]
                    assert Path(host_dir, TOKEN_FILE).read_text() == token + "\n"
                    grant = decode_grant(Path(host_dir, "grant").read_text())
                    assert grant.token == token and grant.container == a.container
                    # the grant binds what the environment says, card by card
                    assert ",".join(map(str, grant.memory_mib)) == run.envs[env.MEMORY_LIMIT_MIB]
                    assert ",".join(map(str, grant.compute_percent)) == run.envs[env.COMPUTE_PERCENT]
                    assert ",".join(grant.card_uuids) == run.envs[env.CARD_UUIDS]
                    assert shim.registry.owner(token) is not None
                    tokens.add(token)
            assert len(tokens) == sum(len(p.placement.containers) for p in pods)
            assert node.agent.stats.refused == 0

    asyncio.run(main())


@pytest.mark.slow
def test_without_a_backend_the_grant_has_no_mounts_and_no_new_variables() -> None:
    gpu_file, pods = generate(5, cards=2, seed=1)

    async def main() -> None:
        async with running_node(gpu_file, [p.json for p in pods], seed=1) as node:
            await node.kubelet.handle_pod_additions([fake_pod(p.json) for p in pods])
            await node.kubelet.wait_idle()
            for fake in node.kubelet.pod_manager.values():
                for run in fake.runs.values():
                    assert run.mounts == {}
                    assert not set(env.OPTIONAL) & set(run.envs)

    asyncio.run(main())
