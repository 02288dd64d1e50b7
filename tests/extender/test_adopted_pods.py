"""Pods HAMi, gpushare or GPUManager placed before a node was migrated: the extender books the
cards their annotations name, so its filter and bind never hand out memory they hold; an unreadable
share books the whole card (an Event says so), an unreadable card keeps GPU pods off the node."""

from __future__ import annotations

from gpupool.extender.booking_problems import ADOPTED_WHOLE
from gpupool.extender.bookings import UNREADABLE
from tests.extender.modes import EVERY_FIT
from tests.extender.test_booking_conflicts import CARD, GIB, World, run
from tests.kube.builders import container, node, pod

HAMI_12000 = pod("hami", container(nvidia__gpu=1, mib=12000), node_name="n1",
                 annotations={"hami.io/vgpu-devices-allocated": "GPU-n1-0,NVIDIA,12000,0:;",
                              "hami.io/vgpu-node": "n1", "hami.io/bind-phase": "success"})


def test_the_card_a_hami_pod_holds_takes_only_what_is_left() -> None:
    async def scenario(world: World) -> None:
        assert world.cache.state.card_usage("n1")[0].memory_free == CARD - 12000
        assert (await world.filter(8 * GIB, ["n1"]))["NodeNames"] == []
        assert "does not fit" in await world.bind("big", 8 * GIB, "n1")
        assert await world.bind("fits", 4 * GIB, "n1") == ""
        assert world.events(ADOPTED_WHOLE) == []
        world.api.delete_pod("default", "hami")  # HAMi's pod ends: its memory is free again
        assert (await world.filter(8 * GIB, ["n1"]))["NodeNames"] == ["n1"]

    run([node("n1", [CARD])], [HAMI_12000], scenario, EVERY_FIT)


def test_a_gpushare_pod_without_its_amount_holds_the_whole_card_and_an_event_says_so() -> None:
    async def scenario(world: World) -> None:
        usage = world.cache.state.card_usage("n1")
        assert (usage[0].memory_free, usage[1].memory_free) == (0, CARD)
        assert await world.bind("other-card", CARD, "n1") == ""  # card 1 is free
        assert "does not fit" in await world.bind("small", 1 * GIB, "n1")  # card 0 is held whole
        assert world.events(ADOPTED_WHOLE) == ["share"]
        assert world.events(ADOPTED_WHOLE) == ["share"]  # once per pod, not on every pass

    share = pod("share", container(**{"aliyun.com/gpu-mem": "4"}), node_name="n1",
                annotations={"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "four"})
    run([node("n1", [CARD, CARD])], [share], scenario, EVERY_FIT)


def test_a_foreign_pod_naming_no_card_keeps_gpu_pods_off_its_node() -> None:
    async def scenario(world: World) -> None:
        answer = await world.filter(1 * GIB, ["n1", "n2"])
        assert answer["NodeNames"] == ["n2"]
        assert "default/lost" in answer["FailedNodes"]["n1"]
        assert world.events(UNREADABLE) == ["lost"]

    lost = pod("lost", container(**{"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8"}),
               node_name="n1", annotations={"tencent.com/predicate-gpu-idx-0": "first"})
    run([node("n1", [CARD]), node("n2", [CARD])], [lost], scenario, EVERY_FIT)
