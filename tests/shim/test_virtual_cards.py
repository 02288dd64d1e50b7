"""One granted card presented as n CUDA ordinals (a virtual-card grant, docs/virtual-cards.md).

The grant gives 8 GiB and 40 % of the stand-in's one card as ``virtual_devices=2``: the program
sees two devices of 4 GiB each, a context of its own on each, and the container as a whole never
holds more than the 8 GiB it was booked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.api.shim_contract import NodeGrant, encode_grant
from gpupool.shim.region import SIZE, read_region
from tests.shim.toolchain import Holder, Toolchain, codes, run_probe

OK, OUT_OF_MEMORY, INVALID_DEVICE, INVALID_CONTEXT = 0, 2, 101, 201
GIB = 1 << 30
MODES = ["symbol", "dlsym", "procaddress"]


def grant_text(region: Path, memory_mib: tuple[int, ...] = (8192,), devices: int = 2) -> str:
    return encode_grant(NodeGrant(memory_mib, (40,) * len(memory_mib), "hard", (), str(region), "", "", "ns/p",
                                  "main", virtual_devices=devices))


@pytest.fixture()
def region(tc: Toolchain, work: Path) -> Iterator[Path]:
    """The container's region as the agent makes it; each test writes its own grant."""
    path = work / "ctr" / "memory.region"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"\0" * SIZE)
    yield path
    tc.grant_file.unlink(missing_ok=True)


@pytest.mark.parametrize("mode", MODES)
def test_the_program_sees_n_devices_each_with_its_share(tc: Toolchain, work: Path, region: Path, mode: str) -> None:
    tc.grant_file.write_text(grant_text(region))
    steps, _ = run_probe(tc, tc.granted_env(work), mode, "count", "totalof:0", "totalof:1", "totalof:2",
                         "name:1", "use:1", "ctxdev", "info", "use:0", "ctxdev", "info", "use:2")
    assert steps[0].values == ("2",)
    assert [s.values[0] for s in steps[1:3]] == [str(4 * GIB)] * 2
    assert steps[3].code == INVALID_DEVICE
    assert steps[4].values == ("gpupool_stand-in_device_0",)  # every ordinal is the card
    assert [s.values for s in (steps[6], steps[9])] == [("1",), ("0",)]
    assert steps[7].values == (str(4 * GIB), str(4 * GIB)) == steps[10].values
    assert steps[5].values[0] == "1" and steps[5].values[1] != steps[8].values[1]  # contexts of their own
    assert steps[11].code == INVALID_DEVICE


@pytest.mark.parametrize("mode", MODES)
def test_each_device_holds_its_share_and_no_more(tc: Toolchain, work: Path, region: Path, mode: str) -> None:
    tc.grant_file.write_text(grant_text(region))
    steps, _ = run_probe(tc, tc.granted_env(work), mode, "use:1", "alloc:3g", "alloc:2g", "alloc:1g", "info",
                         "use:0", "alloc:4g", "alloc:1", "free:1", "use:1", "alloc:1g")
    assert codes(steps) == [OK, OK, OUT_OF_MEMORY, OK, OK, OK, OK, OUT_OF_MEMORY, OK, OK, OK]
    assert steps[4].values[:1] == ("0",)  # device 1 has nothing left


def test_the_container_never_holds_more_than_the_card_total(tc: Toolchain, work: Path, region: Path) -> None:
    """Each process has every device's share; together they still stop at the card's 8 GiB."""
    tc.grant_file.write_text(grant_text(region))
    holder = Holder(tc, tc.granted_env(work), "use:1", "alloc:4g", "use:0", "alloc:3g")
    try:
        assert codes(holder.wait_ready()) == [OK] * 5
        assert read_region(region).devices[0].used_bytes == 7 * GIB
        steps, _ = run_probe(tc, tc.granted_env(work), "symbol", "use:0", "alloc:2g", "use:1", "info", "alloc:1g",
                             "alloc:1")
        assert codes(steps) == [OK, OUT_OF_MEMORY, OK, OK, OK, OUT_OF_MEMORY]
        assert steps[3].values == (str(GIB), str(4 * GIB))  # free: what the card has left, total: the share
    finally:
        holder.kill()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("create", ["newctx", "newctx3", "newctx4"])
def test_a_context_created_on_a_device_counts_there(tc: Toolchain, work: Path, region: Path, create: str,
                                                    mode: str) -> None:
    """cuCtxCreate_v2, _v3 (CUDA 11.4) and _v4 (12.5, what cuGetProcAddress hands a CUDA 12.5+ program
    for "cuCtxCreate"): each context lands on the card and counts as the ordinal it was made for."""
    tc.grant_file.write_text(grant_text(region))
    steps, _ = run_probe(tc, tc.granted_env(work), mode, f"{create}:1", "ctxdev", "alloc:4g", "alloc:1", "ctxdel",
                         "use:0", "alloc:4g", f"{create}:2")
    assert codes(steps) == [OK, OK, OK, OUT_OF_MEMORY, OK, OK, OK, INVALID_DEVICE]
    assert steps[1].values == ("1",)


def test_a_device_context_lives_while_retained(tc: Toolchain, work: Path, region: Path) -> None:
    tc.grant_file.write_text(grant_text(region))
    steps, _ = run_probe(tc, tc.granted_env(work), "symbol", "use:1", "use:1", "unuse:1", "unuse:1", "unuse:1",
                         "use:1")
    assert codes(steps) == [OK, OK, OK, OK, INVALID_CONTEXT, OK]
    assert steps[0].values[1] == steps[1].values[1]  # retained twice: the same context
    assert steps[5].values[1] != steps[0].values[1]  # released to nothing: a new one next time


def test_the_environment_lowers_the_card_before_it_is_split(tc: Toolchain, work: Path, region: Path) -> None:
    tc.grant_file.write_text(grant_text(region))
    steps, _ = run_probe(tc, tc.granted_env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096"), "symbol", "count", "totalof:1")
    assert steps[0].values == ("2",) and steps[1].values == (str(2 * GIB),)


@pytest.mark.parametrize("value", ["0", "-1", "17", "two", "99999999999999999999"])
def test_a_bad_count_leaves_one_device_with_the_total(tc: Toolchain, work: Path, region: Path, value: str) -> None:
    tc.grant_file.write_text(grant_text(region, devices=1) + f"virtual_devices={value}\n")
    steps, stderr = run_probe(tc, tc.granted_env(work), "symbol", "count", "totalof:0", "alloc:8g", "alloc:1")
    assert steps[0].values == ("1",) and steps[1].values == (str(8 * GIB),)
    assert codes(steps)[2:] == [OK, OUT_OF_MEMORY]
    assert f"virtual_devices={value} is not a device count" in stderr


def test_a_grant_without_the_key_is_one_device(tc: Toolchain, work: Path, region: Path) -> None:
    tc.grant_file.write_text(grant_text(region, devices=1))
    steps, _ = run_probe(tc, tc.granted_env(work), "symbol", "count", "totalof:0", "use:1")
    assert steps[0].values == ("1",) and steps[1].values == (str(8 * GIB),)
    assert steps[2].code == INVALID_DEVICE


def test_several_cards_are_never_split(tc: Toolchain, work: Path, region: Path) -> None:
    tc.grant_file.write_text(grant_text(region, memory_mib=(4096, 2048), devices=1) + "virtual_devices=2\n")
    env = tc.granted_env(work, GPUPOOL_STANDIN_DEVICES="2")
    steps, stderr = run_probe(tc, env, "symbol", "count", "totalof:0", "totalof:1")
    assert [s.values for s in steps] == [("2",), (str(4 * GIB),), (str(2 * GIB),)]
    assert "names one card, the grant has 2" in stderr


DEVICE_NAMING_STEPS = ("setaccess", "getaccess", "poolsetaccess", "poolgetaccess", "granularity", "advise",
                       "advise2", "prefetch", "prefetch2", "prefetchptsz", "prefetch2ptsz")


@pytest.mark.parametrize("mode", MODES)
def test_entry_points_naming_an_ordinal_reach_the_card(tc: Toolchain, work: Path, region: Path, mode: str) -> None:
    """Without the translation the stand-in (one card) refuses ordinal 1: each call here would fail."""
    tc.grant_file.write_text(grant_text(region))
    steps, _ = run_probe(tc, tc.granted_env(work), mode,
                         *(s for verb in DEVICE_NAMING_STEPS for s in (f"{verb}:1", "seen", f"{verb}:2")),
                         "p2p:0x1", "p2p:1x1", "p2p:0x2")
    for i in range(len(DEVICE_NAMING_STEPS)):
        ok, seen, beyond = steps[3 * i:3 * i + 3]
        assert ok.code == OK and seen.values == ("0",) and beyond.code == INVALID_DEVICE
    assert steps[3 * DEVICE_NAMING_STEPS.index("granularity")].values == (str(2 << 20),)  # the card's
    assert steps[-3].code == OK and steps[-3].values == ("0",)  # two ordinals are not peers
    assert steps[-2].code == INVALID_DEVICE  # one ordinal with itself: the card with itself, as the driver says
    assert steps[-1].code == INVALID_DEVICE


def test_without_a_virtual_grant_the_device_passes_through(tc: Toolchain, work: Path, region: Path) -> None:
    tc.grant_file.write_text(grant_text(region, memory_mib=(4096, 2048), devices=1))
    env = tc.granted_env(work, GPUPOOL_STANDIN_DEVICES="2")
    steps, _ = run_probe(tc, env, "symbol",
                         *(s for verb in DEVICE_NAMING_STEPS for s in (f"{verb}:1", "seen", f"{verb}:2")), "p2p:0x1")
    for i in range(len(DEVICE_NAMING_STEPS)):
        ok, seen, beyond = steps[3 * i:3 * i + 3]
        assert ok.code == OK and seen.values == ("1",) and beyond.code == INVALID_DEVICE
    assert steps[-1].code == OK and steps[-1].values == ("0",)


@pytest.mark.parametrize("mode", MODES)
def test_every_context_creation_form_keeps_its_own_arguments_without_a_virtual_grant(
        tc: Toolchain, work: Path, region: Path, mode: str) -> None:
    """A CUDA 12.5+ program asking cuGetProcAddress for "cuCtxCreate" gets _v4 (4 arguments); the library
    once answered with its _v2 wrapper (3 arguments), so the context landed on the device its flags
    named. Each form here makes its context on device 1 of two."""
    tc.grant_file.write_text(grant_text(region, memory_mib=(4096, 2048), devices=1))
    env = tc.granted_env(work, GPUPOOL_STANDIN_DEVICES="2")
    steps, _ = run_probe(tc, env, mode, "newctx:1", "ctxdev", "newctx3:1", "ctxdev", "newctx4:1", "ctxdev")
    assert codes(steps) == [OK] * 6
    assert [s.values for s in steps[1::2]] == [("1",)] * 3


@pytest.mark.parametrize("mode", MODES)
def test_cuda_13s_context_device_query_answers_the_ordinal_of_the_context_it_names(
        tc: Toolchain, work: Path, region: Path, mode: str) -> None:
    """cuCtxGetDevice_v2 (CUDA 13, what cuGetProcAddress hands a CUDA 13 program for "cuCtxGetDevice")
    names its context: a context made on ordinal 1 answers 1 while ordinal 0's is current, and the
    current context (NULL) answers the current ordinal."""
    tc.grant_file.write_text(grant_text(region))
    steps, _ = run_probe(tc, tc.granted_env(work), mode, "newctx:1", "ctxdev2", "use:0", "ctxdev2", "ctxdev2:last",
                         "ctxdev")
    assert codes(steps) == [OK] * 6
    assert [steps[i].values[-1] for i in (1, 3, 4, 5)] == ["1", "0", "1", "0"]
