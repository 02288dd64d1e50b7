"""Memory the plain allocation calls do not show: graph memory nodes, memory pools that keep what
is freed into them, and memory imported from another process (docs/isolation.md, "Memory beyond
the allocation calls"). Plain and under ASan+UBSan, through each way a program reaches the driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shim.toolchain import Toolchain, codes, run_probe

OK, OUT_OF_MEMORY = 0, 2
MIB, GIB = 1 << 20, 1 << 30
MODES = ["symbol", "dlsym", "procaddress"]
FIRST = 0  # the probe numbers what it keeps (allocations, pools, graphs, nodes) from 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("node", ["gmem", "gnode"], ids=["cuGraphAddMemAllocNode", "cuGraphAddNode"])
def test_graph_memory_nodes_count_from_creation_to_destruction(tc: Toolchain, work: Path, mode: str,
                                                               node: str) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, "graph", f"{node}:0:768m", f"{node}:0:512m", "alloc:512m", "info",
                         "gdelnode:1", "info", f"{node}:0:1g")
    assert codes(steps) == [OK, OK, OUT_OF_MEMORY, OUT_OF_MEMORY, OK, OK, OK, OK]
    assert steps[4].values[0] == str(256 * MIB)  # the node's 768 MiB are charged, not yet launched
    assert steps[6].values[0] == str(GIB)  # destroying the node gave them back


@pytest.mark.parametrize("mode", MODES)
def test_destroying_a_graph_gives_back_all_of_its_memory_nodes(tc: Toolchain, work: Path, mode: str) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, "graph", "graph", "gmem:0:256m", "gmem:0:256m", "gmem:1:256m",
                         "gdel:0", "info", "gdel:1", "info", "used")
    assert codes(steps) == [OK] * 10
    assert steps[6].values[0] == str(768 * MIB)  # graph 1's node is still charged
    assert steps[8].values[0] == str(GIB)
    assert steps[9].values == (str(0),)  # and the driver has nothing left either


def test_a_graph_node_the_driver_refuses_costs_nothing(tc: Toolchain, work: Path) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024", GPUPOOL_STANDIN_MEMORY_MIB="512")
    steps, _ = run_probe(tc, env, "symbol", "graph", "gmem:0:768m", "info")
    assert codes(steps) == [OK, OUT_OF_MEMORY, OK]  # the card has 512 MiB: the driver says no
    assert steps[2].values[0] == str(512 * MIB)  # cuMemGetInfo: the smaller of limit and card, all free


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pool", ["defpool", "mkpool"], ids=["default-pool", "created-pool"])
def test_a_pool_cannot_be_told_to_keep_freed_memory_under_a_limit(tc: Toolchain, work: Path, mode: str,
                                                                  pool: str) -> None:
    """With the threshold raised, 768 MiB freed into the pool would stay on the card after the
    synchronisation while the budget has them back; cuMemAlloc would then put the container at
    1.5 GiB of a 1 GiB limit. The library passes the raise as 0, so the pool lets them go."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, pool, "setkeep:0:8g", "getkeep:0", "poolalloc:0:768m", "freeasync:1",
                         "sync", "used", "alloc:768m", "used")
    assert codes(steps) == [OK] * 9
    assert steps[2].values == ("0",)  # the driver was asked for 0
    assert steps[6].values == ("0",)
    assert steps[8].values == (str(768 * MIB),)  # what the card holds never passes the limit


def test_without_a_limit_the_pool_keeps_what_it_is_told(tc: Toolchain, work: Path) -> None:
    steps, _ = run_probe(tc, tc.env(work), "procaddress", "mkpool", "setkeep:0:8g", "getkeep:0",
                         "poolalloc:0:768m", "freeasync:1", "sync", "used")
    assert codes(steps) == [OK] * 7
    assert steps[2].values == (str(8 * GIB),)
    assert steps[6].values == (str(768 * MIB),)  # the stand-in keeps it: what the limit prevents


@pytest.mark.parametrize("mode", MODES)
def test_ipc_imported_memory_is_not_charged_to_the_importer(tc: Toolchain, work: Path, mode: str) -> None:
    """The exporter's container holds the charge for the allocation; opening a handle to it maps the
    same memory and allocates none, so the importer's budget does not change."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, "alloc:768m", "ipcopen:0", "info", "alloc:256m", "ipcclose:1", "info",
                         "free:0", "info")
    assert codes(steps) == [OK] * 8
    assert steps[2].values[0] == str(256 * MIB)  # only the exported allocation is charged
    assert steps[5].values[0] == str(0)  # closing the import gives nothing back
    assert steps[7].values[0] == str(768 * MIB)  # freeing the exported allocation does


@pytest.mark.parametrize("mode", MODES)
def test_stream_ordered_memory_of_a_captured_stream_counts_until_its_graph_is_destroyed(
        tc: Toolchain, work: Path, mode: str) -> None:
    """Captured, an allocation and its free become the graph's memory node: every launch holds the
    memory, so the free inside the capture gives nothing back; destroying the graph does."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, "capture", "casync:768m", "cfree:0", "casync:512m", "endcapture",
                         "info", "alloc:512m", "gdel:1", "info", "async:768m", "freeasync:2", "info")
    assert codes(steps) == [OK, OK, OK, OUT_OF_MEMORY, OK, OK, OUT_OF_MEMORY, OK, OK, OK, OK, OK]
    assert steps[5].values[0] == str(256 * MIB)
    assert steps[8].values[0] == str(GIB)
    assert steps[11].values[0] == str(GIB)  # outside a capture a free gives back at once


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prefix", ["p", "t"], ids=["ptsz-entry-points-on-NULL", "CU_STREAM_PER_THREAD"])
def test_capture_on_the_per_thread_default_stream_is_seen(tc: Toolchain, work: Path, mode: str,
                                                          prefix: str) -> None:
    """A program built for per-thread default streams captures on NULL through the _ptsz entry
    points (or names CU_STREAM_PER_THREAD): its allocations there are the graph's, and the free in
    the capture gives nothing back."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, f"{prefix}capture", f"{prefix}casync:768m", f"{prefix}cfree:0",
                         f"{prefix}endcapture", "info", "alloc:512m", "gdel:1", "info", "used")
    assert codes(steps) == [OK, OK, OK, OK, OK, OUT_OF_MEMORY, OK, OK, OK]
    assert steps[4].values[0] == str(256 * MIB)  # the graph holds 768 MiB until it is destroyed
    assert steps[7].values[0] == str(GIB)
    assert steps[8].values == ("0",)


@pytest.mark.parametrize("mode", MODES)
def test_an_allocation_from_another_cards_pool_is_charged_to_that_card(tc: Toolchain, work: Path, mode: str) -> None:
    """The context is on card 0, the pool on card 1: the pool's allocations count against card 1's
    limit, not card 0's."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024,1024", GPUPOOL_STANDIN_DEVICES="2")
    steps, _ = run_probe(tc, env, mode, "mkpool:1", "poolalloc:0:768m", "info", "alloc:768m", "poolalloc:0:512m")
    assert codes(steps) == [OK, OK, OK, OK, OUT_OF_MEMORY]
    assert steps[2].values[0] == str(GIB)  # card 0 untouched by the pool's 768 MiB
