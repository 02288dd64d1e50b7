"""The node's ResourceSlice: one device per healthy card with capacity, request policies and
attributes; the publisher writes it once, and again with a new generation when the cards change."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from gpupool.api.dra import card_of, device_name
from gpupool.core.model import GpuKind
from gpupool.nodeagent.dra.resource_slice import pci_bus_id, resource_slice, slice_name
from gpupool.nodeagent.dra.slice_publisher import SlicePublisher
from tests.nodeagent.dra.dra_world import DRIVER, NODE, SliceDict, inventory


def test_each_card_is_a_shareable_device_with_memory_and_compute_steps() -> None:
    inv = inventory(2, memory_mib=81559)  # not a multiple of 256 MiB: rounded down
    body = resource_slice(NODE, DRIVER, inv, generation=3)
    spec = body["spec"]
    assert body["metadata"]["name"] == slice_name(NODE, DRIVER) == "node-a-gpu.gpupool.io"
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        DRIVER, NODE, {"name": NODE, "generation": 3, "resourceSliceCount": 1})
    gpu1 = spec["devices"][1]
    assert gpu1["name"] == "gpu-1" and gpu1["allowMultipleAllocations"] is True
    assert gpu1["attributes"] == {"model": {"string": "NVIDIA-A100"}, "uuid": {"string": "GPU-0001"},
                                  "index": {"int": 1}, "kind": {"string": "physical"},
                                  "resource.kubernetes.io/pciBusID": {"string": "0000:3c:00.0"}}
    assert gpu1["capacity"]["memory"] == {"value": "81408Mi", "requestPolicy": {
        "default": "81408Mi", "validRange": {"min": "256Mi", "step": "256Mi"}}}
    assert gpu1["capacity"]["compute"] == {"value": "100", "requestPolicy": {
        "default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}}


def test_a_mig_device_says_so_and_offers_its_share_of_the_card() -> None:
    inv = inventory(1)
    mig = replace(inv.cards[0], uuid="MIG-a", compute=428, kind=GpuKind.VIRTUAL, profile="3g.40gb", parent="GPU-p")
    device = resource_slice(NODE, DRIVER, replace(inv, cards=(mig,)), 1)["spec"]["devices"][0]
    assert {k: device["attributes"][k] for k in ("uuid", "kind", "profile", "parent")} == {
        "uuid": {"string": "MIG-a"}, "kind": {"string": "virtual"}, "profile": {"string": "3g.40gb"},
        "parent": {"string": "GPU-p"}}
    assert device["capacity"]["compute"] == {"value": "42", "requestPolicy": {
        "default": "0", "validRange": {"min": "0", "max": "42", "step": "1"}}}


def test_unhealthy_and_too_small_cards_are_left_out() -> None:
    inv = inventory(3)
    inv = replace(inv, cards=(inv.cards[0], replace(inv.cards[1], healthy=False),
                              replace(inv.cards[2], memory_mib=100)))
    assert [d["name"] for d in resource_slice(NODE, DRIVER, inv, 1)["spec"]["devices"]] == ["gpu-0"]


@pytest.mark.parametrize(("nvml", "k8s"), [
    pytest.param("00000000:3B:00.0", "0000:3b:00.0", id="nvml"),
    pytest.param("0000:af:00.1", "0000:af:00.1", id="already-short"),
    pytest.param("", "", id="unknown"),
    pytest.param("garbage", "", id="garbage"),
])
def test_pci_bus_id_in_the_standard_attributes_form(nvml: str, k8s: str) -> None:
    assert pci_bus_id(nvml) == k8s


@pytest.mark.parametrize("name", ["gpu-", "gpu-x", "mig-1", "gpu--1", "gpu-1234567"])
def test_names_gpupool_never_publishes_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="is not one of gpupool's"):
        card_of(name)


def test_device_names_round_trip() -> None:
    assert card_of(device_name(12)) == 12


def test_the_publisher_writes_once_then_only_on_change_with_a_new_generation() -> None:
    async def main() -> None:
        store = SliceDict()
        cards = [inventory(2)]
        publisher = SlicePublisher(NODE, DRIVER, store, lambda: cards[0])
        assert await publisher.publish() is True
        assert await publisher.publish() is False
        inv = cards[0]
        cards[0] = replace(inv, cards=(inv.cards[0], replace(inv.cards[1], healthy=False)))
        assert await publisher.publish() is True
        written = store.slices[slice_name(NODE, DRIVER)]
        assert written["spec"]["pool"]["generation"] == 2 and len(written["spec"]["devices"]) == 1
        assert store.writes == 2
    asyncio.run(main())


def test_the_publisher_loop_republishes_after_each_change_and_retries_failures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpupool.nodeagent.dra.slice_publisher.RETRY_S", 0.01)

    async def main() -> None:
        store = SliceDict()
        failures = [RuntimeError("apiserver away")]
        real_write = store.write_slice

        async def flaky(body: object, version: str | None) -> None:
            if failures:
                raise failures.pop()
            await real_write(body, version)  # type: ignore[arg-type]

        store.write_slice = flaky  # type: ignore[method-assign]
        cards = [inventory(2)]
        changes: asyncio.Queue[int] = asyncio.Queue()

        async def changed(seen: int) -> int:
            return await changes.get()

        task = asyncio.create_task(SlicePublisher(NODE, DRIVER, store, lambda: cards[0]).run(changed, 0))
        for _ in range(200):
            if store.writes == 1:
                break
            await asyncio.sleep(0.01)
        assert store.writes == 1
        cards[0] = replace(cards[0], cards=(cards[0].cards[0], replace(cards[0].cards[1], healthy=False)))
        changes.put_nowait(1)
        for _ in range(200):
            if store.writes == 2:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        assert store.slices[slice_name(NODE, DRIVER)]["spec"]["pool"]["generation"] == 2
    asyncio.run(main())


def test_the_publisher_writes_a_deleted_slice_again_at_its_resync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpupool.nodeagent.dra.slice_publisher.RESYNC_S", 0.02)

    async def main() -> None:
        store = SliceDict()

        async def never(seen: int) -> int:
            await asyncio.Event().wait()
            return seen

        task = asyncio.create_task(SlicePublisher(NODE, DRIVER, store, lambda: inventory(2)).run(never, 0))
        for _ in range(200):
            if store.writes == 1:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert store.writes == 1  # unchanged: read back, never rewritten
        store.slices.clear()  # kubelet wiped the driver's slices
        for _ in range(200):
            if store.slices:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        assert store.slices[slice_name(NODE, DRIVER)]["spec"]["pool"]["generation"] == 1
    asyncio.run(main())


def test_an_apiserver_without_consumable_capacity_is_noticed_not_fought(caplog: pytest.LogCaptureFixture) -> None:
    """Kubernetes 1.35 drops allowMultipleAllocations and requestPolicy (DRAConsumableCapacity off):
    the publisher must not rewrite the slice at every resync, and says once what it means."""
    from gpupool.nodeagent.dra.slice_publisher import SHARING_FIELDS

    class DroppingStore(SliceDict):
        async def write_slice(self, body: Any, resource_version: str | None) -> None:
            devices = [{**{k: v for k, v in d.items() if k not in SHARING_FIELDS},
                        "capacity": {n: {"value": c["value"]} for n, c in d["capacity"].items()}}
                       for d in body["spec"]["devices"]]
            await super().write_slice({**body, "spec": {**body["spec"], "devices": devices}}, resource_version)

    async def main() -> None:
        store = DroppingStore()
        publisher = SlicePublisher(NODE, DRIVER, store, lambda: inventory(2))
        assert await publisher.publish() is True
        with caplog.at_level("WARNING"):
            assert await publisher.publish() is False
            assert await publisher.publish() is False
        assert store.writes == 1 and publisher.consumable_capacity is False
        assert sum("DRAConsumableCapacity is off" in r.message for r in caplog.records) == 1
    asyncio.run(main())
