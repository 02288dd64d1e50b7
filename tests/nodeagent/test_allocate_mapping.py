"""The Allocate mapping under load: every container gets exactly its scheduled cards.

200 pods with varied requests (equal requests on different cards, multi-container pods, GPU init
containers, GPU sidecars as app containers and as native sidecars, whole cards) reach the fake
kubelet in random batches and random order; kubelet admits them as 1.35-1.37 do. The test checks
each started container's env against the scheduler's assignment, the absence of env conflicts and
refusals, and the allocated-v1 annotation. Then: kubelet steered onto each container's own cards,
a kubelet restart and an in-place resize that call no Allocate, and an agent that lost its served
log.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict

import pytest

from gpupool.api.annotations import decode_allocated
from gpupool.nodeagent.allocation_mapper import AllocationMapper
from gpupool.nodeagent.device_layout import DeviceLayout
from gpupool.testing.fake_kubelet import FakeKubelet, FakePod
from gpupool.testing.node_workload import WorkloadPod, generate
from tests.nodeagent.container_env import check_container_env
from tests.nodeagent.harness import NAMES, fake_pod, running_node

# Slow, so scripts/test-all runs it and a plain pytest does not: 200 pods per seed on the fake kubelet, restarts and
# resizes: the suite's heaviest unit module.
pytestmark = pytest.mark.slow


def batches(items: list[WorkloadPod], rng: random.Random) -> list[list[WorkloadPod]]:
    items = list(items)
    rng.shuffle(items)
    out, i = [], 0
    while i < len(items):
        n = rng.randint(1, 12)
        out.append(items[i:i + n])
        i += n
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_200_pods_random_batches_every_container_exact(seed: int) -> None:
    gpu_file, pods = generate(200, cards=16, seed=seed)
    uuids = {i: c["uuid"] for i, c in enumerate(gpu_file["cards"])}
    rng = random.Random(seed)

    async def main() -> None:
        async with running_node(gpu_file, [p.json for p in pods], seed=seed) as node:
            k = node.kubelet
            # Batches arrive concurrently (several config updates in flight); kubelet serialises.
            await asyncio.gather(*(k.handle_pod_additions([fake_pod(p.json) for p in b])
                                   for b in batches(pods, rng)))
            await k.wait_idle(60)
            await node.agent.flush()
            fakes = {(p.namespace, p.name): p for p in k.pod_manager.values()}
            failed = [(key, p.reason) for key, p in fakes.items() if p.phase != "Running"]
            assert not failed, failed
            checked = sum(check_container_env(p, fakes[p.key], uuids) for p in pods)
            assert checked == sum(len(p.placement.containers) for p in pods)
            assert node.agent.stats.refused == 0
            assert node.agent.stats.mismatches == 0
            # Serial admission + newest-pod rule: no tie-breaking was ever needed.
            assert set(node.agent.stats.bases) <= {"unique", "newest"}, node.agent.stats.bases
            for p in pods:
                raw = node.source.annotation(*p.key, NAMES.allocated)
                assert raw is not None, p.key
                served = {c.name: c for c in decode_allocated(raw).containers}
                for a in p.placement.containers:
                    got = [(r.index, r.memory_mib, r.compute) for r in served[a.container].cards]
                    assert got == [(s.card, s.memory_mib, s.compute) for s in a.slices]
            # kubelet was steered onto the assigned cards for most requests (advisory only).
            assert k.preferred_calls > 0
    asyncio.run(main())


def test_equal_requests_on_different_cards_are_not_swapped() -> None:
    """Pods with identical requests, each on its own card, admitted in reverse creation order."""
    gpu_file, pods = generate(60, cards=8, seed=11)
    uuids = {i: c["uuid"] for i, c in enumerate(gpu_file["cards"])}
    by_shape: dict[str, list[WorkloadPod]] = defaultdict(list)
    for p in pods:
        by_shape[json.dumps(p.json["spec"], sort_keys=True)].append(p)
    twins = max(by_shape.values(), key=len)
    assert len(twins) >= 5 and len({p.placement.containers[0].slices[0].card for p in twins}) >= 2

    async def main() -> None:
        async with running_node(gpu_file, [p.json for p in twins]) as node:
            k = node.kubelet
            for p in reversed(twins):
                await k.handle_pod_additions([fake_pod(p.json)])
            await k.wait_idle()
            fakes = {(p.namespace, p.name): p for p in k.pod_manager.values()}
            for p in twins:
                check_container_env(p, fakes[p.key], uuids)
    asyncio.run(main())


def test_rejected_pods_in_the_same_batch_never_overcommit_and_annotations_tell_the_truth() -> None:
    """Adversarial: kubelet rejects some pods (not for GPUs) just before admitting others.

    kubelet 1.20 kept listing a rejected pod in PodResources (one case where two pods could first
    appear in the same snapshot); 1.35-1.37 list active pods only, so it leaves the listing at once.
    Either way the mapper must (a) never
    hand a container a grant of a different request signature, (b) record in allocated-v1 what
    each running container really got, (c) keep every card within its memory and compute.
    """
    gpu_file, pods = generate(120, cards=16, seed=5)
    cards = {i: c["memoryMiB"] for i, c in enumerate(gpu_file["cards"])}
    rng = random.Random(5)
    rejected = {p.key for p in pods if rng.random() < 0.25}

    def reject(pod: FakePod) -> str | None:
        return "OutOfcpu" if (pod.namespace, pod.name) in rejected else None

    async def main() -> None:
        async with running_node(gpu_file, [p.json for p in pods], seed=5, reject=reject) as node:
            k = node.kubelet
            await asyncio.gather(*(k.handle_pod_additions([fake_pod(p.json) for p in b])
                                   for b in batches(pods, rng)))
            await k.wait_idle(60)
            await asyncio.sleep(0.2)  # one reconcile poll
            await node.agent.flush()
            by_key = {p.key: p for p in pods}
            mem: dict[int, int] = defaultdict(int)
            compute: dict[int, int] = defaultdict(int)
            for fake in k.pod_manager.values():
                key = (fake.namespace, fake.name)
                if key in rejected:
                    assert fake.phase == "Failed"
                    continue
                assert fake.phase == "Running", (key, fake.reason)
                raw = node.source.annotation(*key, NAMES.allocated)
                assert raw is not None, key
                truth = {c.name: c for c in decode_allocated(raw).containers}
                for a in by_key[key].placement.containers:
                    env = fake.runs[a.container].envs
                    got_cards = [int(c) for c in env["GPUPOOL_CARD_INDICES"].split(",")]
                    got_mem = [int(m) for m in env["GPUPOOL_MEMORY_LIMIT_MIB"].split(",")]
                    # (a) same request signature as scheduled
                    assert got_mem == [s.memory_mib for s in a.slices], key
                    # (b) the annotation names the cards in the env
                    assert [r.index for r in truth[a.container].cards] == got_cards, key
                    if not a.init:
                        for card, m, pct in zip(got_cards, got_mem,
                                                env["GPUPOOL_COMPUTE_PERCENT"].split(","), strict=True):
                            mem[card] += m
                            compute[card] += int(pct)
            # (c) no card over-committed by what containers really run with
            for card, used in mem.items():
                assert used <= cards[card], (card, used)
                assert compute[card] <= 100, (card, compute[card])
            assert node.agent.stats.refused == 0
    asyncio.run(main())


def off_cards(kubelet: FakeKubelet, pods: list[WorkloadPod]) -> list[tuple[str, str, str, list[str]]]:
    """(pod, container, resource, IDs) of every recorded device set with an ID off the container's
    assigned cards."""
    uids = {p.json["metadata"]["uid"]: p for p in pods}
    off = []
    for (uid, cname, resource), ids in kubelet.pod_devices.items():
        pod = uids.get(uid)
        if pod is None:
            continue
        [assigned] = [a for a in pod.placement.containers if a.container == cname]
        if any(DeviceLayout.card_of(i) not in assigned.cards for i in ids):
            off.append((pod.key[1], cname, resource, sorted(ids)))
    return off


def test_kubelet_is_steered_onto_each_containers_own_cards_within_a_batch() -> None:
    """GetPreferredAllocation reads PodResources like Allocate does (kubelet 1.35-1.37 call it
    without their device-manager lock, with the pod being admitted already listed), so even the pods
    of one batch, which no earlier snapshot listed, get device IDs on their own cards.

    Pods without regular init containers only: an app container that reuses an init container's
    devices gets that container's IDs, wherever they are."""
    gpu_file, pods = generate(80, cards=8, seed=9)
    simple = [p for p in pods if not any(a.init for a in p.placement.containers)]
    assert len(simple) > 60

    async def main() -> None:
        async with running_node(gpu_file, [p.json for p in simple], seed=9) as node:
            k = node.kubelet
            await k.handle_pod_additions([fake_pod(p.json) for p in simple])  # one batch
            await k.wait_idle(60)
            assert all(p.phase == "Running" for p in k.pod_manager.values())
            assert k.preferred_calls > 0
            assert off_cards(k, simple) == []
    asyncio.run(main())


def test_kubelet_restart_and_in_place_resize_call_no_allocate_and_the_next_pods_map_exactly() -> None:
    """A kubelet restart re-admits every pod in one batch from its checkpoint, an in-place resize
    re-admits one pod: neither calls Allocate. Then the agent loses its served log (a restart of its
    own: only PodResources and ``allocated-v1`` tell what was served) and the next batch, twins of
    the first pods included, still maps exactly."""
    gpu_file, pods = generate(90, cards=16, seed=4)
    first, later = pods[:60], pods[60:]
    uuids = {i: c["uuid"] for i, c in enumerate(gpu_file["cards"])}

    async def main() -> None:
        async with running_node(gpu_file, [p.json for p in pods], seed=4) as node:
            k = node.kubelet
            await k.handle_pod_additions([fake_pod(p.json) for p in first])
            await k.wait_idle(60)
            await node.agent.flush()
            calls, devices = k.allocate_calls, dict(k.pod_devices)
            await k.restart()
            await k.wait_registered(len(NAMES.all()), count=2)
            await k.readmit()
            for p in first[:5]:
                await k.resize(p.json["metadata"]["uid"])
            assert (k.allocate_calls, k.pod_devices, k.resizes) == (calls, devices, 5)
            assert all(p.phase == "Running" for p in k.pod_manager.values()), \
                [(p.name, p.reason) for p in k.pod_manager.values() if p.phase != "Running"]
            node.agent.mapper = AllocationMapper("node-a")  # the agent restarted: its served log is gone
            await asyncio.gather(*(k.handle_pod_additions([fake_pod(p.json) for p in b])
                                   for b in batches(later, random.Random(4))))
            await k.wait_idle(60)
            fakes = {(p.namespace, p.name): p for p in k.pod_manager.values()}
            assert [(key, p.reason) for key, p in fakes.items() if p.phase != "Running"] == []
            assert sum(check_container_env(p, fakes[p.key], uuids) for p in later) == sum(
                len(p.placement.containers) for p in later)
            assert node.agent.stats.refused == 0
            assert set(node.agent.stats.bases) <= {"unique", "newest"}, node.agent.stats.bases
    asyncio.run(main())
