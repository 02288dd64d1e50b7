"""The DRA kubelet plugin against a fake kubelet speaking the real gRPC protocols: registration,
prepare, unprepare, repeated calls, an agent restart, and claims it must refuse."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping
from typing import Any

import grpc
import pytest

from gpupool.api.environment import ContainerEnvironment
from gpupool.nodeagent.dra import checkpoint
from gpupool.nodeagent.dra.checkpoint import CheckpointError
from gpupool.nodeagent.dra.server import DraPluginServer
from gpupool.testing.fake_dra_kubelet import ClaimName, FakeDraKubelet
from tests.nodeagent.dra.dra_world import (
    DRIVER,
    ClaimStore,
    claim_object,
    inventory,
    make_driver,
    result,
    serving,
    temp_dir,
)


def cdi_env(directory: str, uid: str) -> dict[str, str]:
    """The env of a claim's CDI device, as the container runtime would apply it."""
    with open(f"{directory}/cdi/gpupool.io-claim_{uid}.json", encoding="utf-8") as f:
        spec = json.load(f)
    assert spec["kind"] == "gpupool.io/claim"
    (device,) = spec["devices"]
    assert device["name"] == uid
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


def test_registers_as_a_dra_plugin_on_one_socket() -> None:
    async def main() -> None:
        with temp_dir() as d:
            async with serving(d, ClaimStore(), [inventory()]) as node:
                assert node.kubelet.drivers == {DRIVER: node.driver.server.socket_path}
                assert node.driver.server.socket_path.endswith(f"/kubelet/plugins_registry/{DRIVER}-reg.sock")
                assert node.driver.server.registered.is_set()
    asyncio.run(main())


def test_two_4gib_claims_share_one_card_each_with_its_grant() -> None:
    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            a = claims.add(claim_object("a", "uid-a", [result("gpu-1", "4Gi", "30", share_id="sa")], pod="p1"))
            b = claims.add(claim_object("b", "uid-b", [result("gpu-1", "4Gi", share_id="sb")], pod="p2"))
            async with serving(d, claims, [inventory()]) as node:
                answers = await node.kubelet.prepare(DRIVER, [a, b])
                assert answers["uid-a"].error == "" and answers["uid-b"].error == ""
                assert answers["uid-a"].devices == ((("gpu",), "node-a", "gpu-1", ("gpupool.io/claim=uid-a",), "sa"),)
                assert answers["uid-b"].devices[0][4] == "sb"
                env_a = ContainerEnvironment.from_env(cdi_env(d, "uid-a"))
                env_b = ContainerEnvironment.from_env(cdi_env(d, "uid-b"))
                assert (env_a.pod, env_a.container) == ("ns/p1", "a")
                assert [(c.index, c.uuid, c.memory_mib, c.compute_percent) for c in env_a.cards] == [
                    (1, "GPU-0001", 4096, 30)]
                assert [(c.memory_mib, c.compute_percent) for c in env_b.cards] == [(4096, 0)]
                with open(f"{d}/cdi/gpupool.io-claim_uid-a.json", encoding="utf-8") as f:
                    nodes = json.load(f)["devices"][0]["containerEdits"]["deviceNodes"]
                assert nodes[0]["path"] == "/dev/nvidia1"
    asyncio.run(main())


def test_a_repeated_prepare_answers_the_same_without_reading_the_claim() -> None:
    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            a = claims.add(claim_object("a", "uid-a", [result()]))
            async with serving(d, claims, [inventory()]) as node:
                first = await node.kubelet.prepare(DRIVER, [a])
                reads = claims.reads
                os.unlink(f"{d}/cdi/gpupool.io-claim_uid-a.json")  # lost: written again
                again = await node.kubelet.prepare(DRIVER, [a])
                assert again == first and claims.reads == reads
                assert cdi_env(d, "uid-a")
                assert node.driver.state.stats.prepared == 1 and node.driver.state.stats.repeated == 1
    asyncio.run(main())


def test_unprepare_removes_the_spec_and_frees_the_share_and_is_idempotent() -> None:
    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            big = claims.add(claim_object("big", "uid-big", [result("gpu-0", "12Gi")]))
            more = claims.add(claim_object("more", "uid-more", [result("gpu-0", "8Gi")]))
            async with serving(d, claims, [inventory()]) as node:
                assert (await node.kubelet.prepare(DRIVER, [big]))["uid-big"].error == ""
                refused = (await node.kubelet.prepare(DRIVER, [more]))["uid-more"].error
                assert "8192 MiB and 0% asked, 12288 MiB and 0% of its 16384 MiB, 100% held by ns/claim big" in refused
                assert await node.kubelet.unprepare(DRIVER, [big]) == {"uid-big": ""}
                assert not os.path.exists(f"{d}/cdi/gpupool.io-claim_uid-big.json")
                assert await node.kubelet.unprepare(DRIVER, [big]) == {"uid-big": ""}
                unknown = ClaimName("ns", "never", "uid-never")
                assert await node.kubelet.unprepare(DRIVER, [unknown]) == {"uid-never": ""}
                assert (await node.kubelet.prepare(DRIVER, [more]))["uid-more"].error == ""
    asyncio.run(main())


def test_an_agent_restart_remembers_prepared_claims() -> None:
    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            a = claims.add(claim_object("a", "uid-a", [result("gpu-0", "4Gi")]))
            cards = [inventory()]
            async with serving(d, claims, cards) as node:
                first = await node.kubelet.prepare(DRIVER, [a])
            claims.objects.clear()  # the claim is gone from the API: only the checkpoint knows it
            async with serving(d, claims, cards) as node:
                assert set(node.driver.state.claims) == {"uid-a"}
                assert await node.kubelet.prepare(DRIVER, [a]) == first
                assert await node.kubelet.unprepare(DRIVER, [a]) == {"uid-a": ""}
            async with serving(d, claims, cards) as node:
                assert node.driver.state.claims == {}
    asyncio.run(main())


@pytest.mark.parametrize(("results", "uid", "reason"), [
    pytest.param(None, "uid-x", "is not allocated", id="not-allocated"),
    pytest.param([result(driver="other.example.com")], "uid-x", "has no device of driver gpu.gpupool.io",
                 id="other-driver"),
    pytest.param([result(pool="node-b")], "uid-x", "allocated from pool 'node-b'", id="other-node"),
    pytest.param([result("gpu-7")], "uid-x", "device gpu-7 is not on node node-a", id="vanished-card"),
    pytest.param([result("mig-1")], "uid-x", "is not one of gpupool's", id="foreign-device"),
    pytest.param([result(memory="lots")], "uid-x", "is not a Kubernetes quantity", id="bad-quantity"),
    pytest.param([result(memory="20Gi")], "uid-x", "would be over-committed: 20480 MiB", id="more-than-the-card"),
    pytest.param([result(memory="10Gi"), result(memory="10Gi", request="b")], "uid-x",
                 "would be over-committed: 20480 MiB",
                 id="two-shares-of-one-card-together-too-much"),
    pytest.param([result(compute="150")], "uid-x", "is not 0-100 percent", id="impossible-compute"),
    pytest.param([result()], "uid-other", "the API has UID 'uid-x'", id="recreated-claim"),
])
def test_bad_claims_are_refused_with_a_reason_and_leave_nothing(results: list[dict[str, Any]] | None, uid: str,
                                                                reason: str) -> None:
    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            obj = claim_object("x", "uid-x", results or [])
            if results is None:
                del obj["status"]["allocation"]
            claims.add(obj)
            ref = ClaimName("ns", "x", uid)
            async with serving(d, claims, [inventory()]) as node:
                answer = (await node.kubelet.prepare(DRIVER, [ref]))[uid]
                assert reason in answer.error and answer.devices == ()
                assert node.driver.state.claims == {}
                assert not os.listdir(f"{d}/cdi") if os.path.isdir(f"{d}/cdi") else True
    asyncio.run(main())


def test_a_missing_claim_is_refused() -> None:
    async def main() -> None:
        with temp_dir() as d:
            async with serving(d, ClaimStore(), [inventory()]) as node:
                answer = (await node.kubelet.prepare(DRIVER, [ClaimName("ns", "gone", "uid-g")]))["uid-g"]
                assert "does not exist" in answer.error
    asyncio.run(main())


def test_a_card_gone_after_prepare_refuses_only_new_claims() -> None:
    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            a = claims.add(claim_object("a", "uid-a", [result("gpu-1")]))
            b = claims.add(claim_object("b", "uid-b", [result("gpu-1")]))
            async with serving(d, claims, [inventory()]) as node:
                assert (await node.kubelet.prepare(DRIVER, [a]))["uid-a"].error == ""
                node.remove_card(1)
                answers = await node.kubelet.prepare(DRIVER, [a, b])
                assert answers["uid-a"].error == ""  # already prepared: its containers may be running
                assert "not on node node-a" in answers["uid-b"].error
    asyncio.run(main())


@pytest.mark.parametrize("text", [
    pytest.param("{not json", id="not-json"),
    pytest.param('{"version": 9, "claims": []}', id="other-version"),
    pytest.param('{"version": 1, "claims": [{"claim": {"uid": "u"}}]}', id="malformed-entry"),
])
def test_a_corrupt_checkpoint_is_a_clear_error(text: str) -> None:
    with temp_dir() as d:
        path = f"{d}/kubelet/plugins/{DRIVER}/prepared-claims.json"
        os.makedirs(os.path.dirname(path))
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        with pytest.raises(CheckpointError, match=r"the DRA checkpoint .*prepared-claims.json is not readable"):
            make_driver(d, ClaimStore(), [inventory()])


def test_kubelet_refuses_a_plugin_without_a_service_it_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        with temp_dir() as d:
            driver = make_driver(d, ClaimStore(), [inventory()])
            monkeypatch.setattr("gpupool.nodeagent.dra.server.DRA_SERVICE", "v9.DRAPlugin")
            await driver.server.start()
            try:
                with pytest.raises(Exception, match="none of services supported"):
                    await FakeDraKubelet().register(driver.server.socket_path)
                assert not driver.server.registered.is_set()
                assert "none of services" in driver.server.refusal
            finally:
                await driver.server.stop()
    asyncio.run(main())


def test_the_server_serves_again_when_its_socket_is_removed() -> None:
    async def main() -> None:
        with temp_dir() as d:
            driver = make_driver(d, ClaimStore(), [inventory()])
            server: DraPluginServer = driver.server
            task = asyncio.create_task(server.run(poll_s=0.02))
            try:
                for _ in range(100):
                    if os.path.exists(server.socket_path):
                        break
                    await asyncio.sleep(0.02)
                os.unlink(server.socket_path)
                for _ in range(100):
                    if os.path.exists(server.socket_path):
                        break
                    await asyncio.sleep(0.02)
                assert await FakeDraKubelet().register(server.socket_path) == DRIVER
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert not os.path.exists(server.socket_path)
    asyncio.run(main())


def test_concurrent_calls_share_checkpoint_writes_and_answer_only_once_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[int] = []
    real_save = checkpoint.save

    def counting_save(path: str, claims: Mapping[str, Any], *kept: Any) -> None:
        real_save(path, claims, *kept)
        writes.append(len(claims))

    monkeypatch.setattr(checkpoint, "save", counting_save)

    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            refs = [claims.add(claim_object(f"c{i}", f"uid-{i}", [result(f"gpu-{i % 2}", "256Mi")]))
                    for i in range(40)]
            async with serving(d, claims, [inventory()]) as node:
                async def one(ref: ClaimName) -> None:
                    answer = (await node.kubelet.prepare(DRIVER, [ref]))[ref.uid]
                    assert answer.error == ""
                    on_disk = checkpoint.load(node.driver.state.checkpoint_path)
                    assert ref.uid in on_disk  # answered only once the file holds it

                await asyncio.gather(*(one(r) for r in refs))
                assert writes[-1] == 40 and len(writes) < 40
    asyncio.run(main())


def test_a_failed_checkpoint_write_fails_the_call_and_the_retry_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    real_save = checkpoint.save
    failures = [OSError("No space left on device")]

    def flaky_save(path: str, claims: Mapping[str, Any], *kept: Any) -> None:
        if failures:
            raise failures.pop()
        real_save(path, claims, *kept)

    monkeypatch.setattr(checkpoint, "save", flaky_save)

    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            a = claims.add(claim_object("a", "uid-a", [result()]))
            async with serving(d, claims, [inventory()]) as node:
                with pytest.raises(grpc.aio.AioRpcError, match="No space left on device"):
                    await node.kubelet.prepare(DRIVER, [a])
                assert (await node.kubelet.prepare(DRIVER, [a]))["uid-a"].error == ""
                assert set(checkpoint.load(node.driver.state.checkpoint_path)) == {"uid-a"}
    asyncio.run(main())


def test_the_same_claim_prepared_twice_at_once_is_prepared_once() -> None:
    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            a = claims.add(claim_object("a", "uid-a", [result()]))
            async with serving(d, claims, [inventory()]) as node:
                first, second = await asyncio.gather(node.kubelet.prepare(DRIVER, [a]),
                                                     node.kubelet.prepare(DRIVER, [a]))
                assert first == second and first["uid-a"].error == ""
                assert node.driver.state.stats.prepared == 1
                assert os.listdir(f"{d}/cdi") == ["gpupool.io-claim_uid-a.json"]
    asyncio.run(main())


def test_a_cdi_spec_that_cannot_be_written_refuses_the_claim_and_forgets_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.nodeagent.dra.cdi import CdiSpecs

    real_write = CdiSpecs.write
    failures = [OSError("Read-only file system")]

    def flaky_write(self: CdiSpecs, uid: str, grant: Any) -> str:
        if failures:
            raise failures.pop()
        return real_write(self, uid, grant)

    monkeypatch.setattr(CdiSpecs, "write", flaky_write)

    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            a = claims.add(claim_object("a", "uid-a", [result()]))
            async with serving(d, claims, [inventory()]) as node:
                answer = (await node.kubelet.prepare(DRIVER, [a]))["uid-a"]
                assert "writing the CDI spec of claim" in answer.error and "Read-only file system" in answer.error
                assert node.driver.state.claims == {}
                assert (await node.kubelet.prepare(DRIVER, [a]))["uid-a"].error == ""
                assert cdi_env(d, "uid-a")
    asyncio.run(main())


def test_the_slice_is_published_only_once_kubelet_registered_the_driver() -> None:
    async def main() -> None:
        with temp_dir() as d:
            driver = make_driver(d, ClaimStore(), [inventory()])
            never_changes = asyncio.Event()

            async def changed(seen: int) -> int:
                await never_changes.wait()
                return seen

            task = asyncio.create_task(driver.run(changed, 0))
            try:
                for _ in range(100):
                    if os.path.exists(driver.server.socket_path):
                        break
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.2)
                assert driver.publisher.writes == 0  # serving, not registered: no slice yet
                await FakeDraKubelet().register(driver.server.socket_path)
                for _ in range(100):
                    if driver.publisher.writes:
                        break
                    await asyncio.sleep(0.02)
                assert driver.publisher.writes == 1
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    asyncio.run(main())


def test_a_claim_of_two_requests_hands_its_grant_to_a_container_of_either_request() -> None:
    """kubelet gives a container that references ``request: b`` only the CDI ids of devices naming
    ``b``: the device with the claim's grant names both requests, the other device none of it."""
    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            two = claims.add(claim_object("two", "uid-2", [result("gpu-0", "4Gi", request="a", share_id="sa"),
                                                           result("gpu-1", "2Gi", request="b", share_id="sb")]))
            async with serving(d, claims, [inventory()]) as node:
                answers = await node.kubelet.prepare(DRIVER, [two])
                assert answers["uid-2"].error == ""
                assert answers["uid-2"].devices == (
                    (("a", "b"), "node-a", "gpu-0", ("gpupool.io/claim=uid-2",), "sa"),
                    (("b",), "node-a", "gpu-1", (), "sb"))
                grant = ContainerEnvironment.from_env(cdi_env(d, "uid-2"))
                assert [(c.index, c.memory_mib) for c in grant.cards] == [(0, 4096), (1, 2048)]
    asyncio.run(main())
