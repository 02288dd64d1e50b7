"""A graph's memory nodes after the graph: its executable graph keeps the memory when the graph is
destroyed first (as frameworks do right after instantiating), and a copy (a clone, a second
executable graph), which CUDA refuses for graphs with memory nodes, is charged like the original
where a driver allows it (docs/isolation.md, "Memory beyond the allocation calls"). Plain and under
ASan+UBSan, through each way a program reaches the driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shim.toolchain import Toolchain, codes, run_probe

OK, OUT_OF_MEMORY, INVALID_VALUE, NOT_SUPPORTED = 0, 2, 1, 801
MIB, GIB = 1 << 20, 1 << 30
MODES = ["symbol", "dlsym", "procaddress"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("instantiate", ["inst", "instp", "instl"],
                         ids=["cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams", "cuGraphInstantiate_v2"])
def test_the_executable_graph_keeps_the_charge_of_a_destroyed_graph(tc: Toolchain, work: Path, mode: str,
                                                                     instantiate: str) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, "graph", "gmem:0:768m", f"{instantiate}:0", "gdel:0", "info",
                         "alloc:512m", "used", "execdel:2", "info", "used")
    assert codes(steps) == [OK, OK, OK, OK, OK, OUT_OF_MEMORY, OK, OK, OK, OK]
    assert steps[4].values[0] == str(256 * MIB)  # the graph is gone, its executable graph is not
    assert steps[6].values == (str(768 * MIB),)
    assert steps[8].values[0] == str(GIB)
    assert steps[9].values == ("0",)


@pytest.mark.parametrize("mode", MODES)
def test_destroying_the_executable_graph_first_leaves_the_charge_with_the_graph(tc: Toolchain, work: Path,
                                                                                 mode: str) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, "graph", "gmem:0:768m", "inst:0", "execdel:2", "info", "gdel:0", "info")
    assert codes(steps) == [OK] * 7
    assert steps[4].values[0] == str(256 * MIB)
    assert steps[6].values[0] == str(GIB)


def test_a_graph_with_memory_nodes_is_not_cloned_or_instantiated_twice(tc: Toolchain, work: Path) -> None:
    """CUDA's rule, which the stand-in follows: nothing is copied, nothing more is charged."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, "procaddress", "graph", "gmem:0:512m", "clone:0", "inst:0", "inst:0", "info")
    assert codes(steps) == [OK, OK, NOT_SUPPORTED, OK, INVALID_VALUE, OK]
    assert steps[5].values[0] == str(512 * MIB)


@pytest.mark.parametrize("mode", MODES)
def test_a_driver_that_copies_memory_nodes_gets_each_copy_charged(tc: Toolchain, work: Path, mode: str) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024", GPUPOOL_STANDIN_GRAPH_COPIES="1")
    steps, _ = run_probe(tc, env, mode, "graph", "gmem:0:384m", "clone:0", "info", "clone:0", "inst:0", "inst:2",
                         "inst:2", "info", "gdel:2", "execdel:3", "info", "execdel:4", "info", "used")
    assert codes(steps) == [OK, OK, OK, OK, OUT_OF_MEMORY, OK, OK, OUT_OF_MEMORY, OK, OK, OK, OK, OK, OK, OK]
    assert steps[3].values[0] == str(256 * MIB)  # the clone's 384 MiB beside the original's
    assert steps[8].values[0] == str(256 * MIB)  # no third copy fits
    assert steps[11].values[0] == str(256 * MIB)  # the clone's memory passed to its executable graph
    assert steps[13].values[0] == str(640 * MIB)  # only the original's node is left
    assert steps[14].values == (str(384 * MIB),)


@pytest.mark.parametrize("mode", MODES)
def test_a_child_graph_moved_into_its_parent_goes_with_the_parent(tc: Toolchain, work: Path, mode: str) -> None:
    """A graph with memory nodes can only be a child by moving it into the parent, which owns and
    destroys it from then on: its charge goes with the parent (and its executable graph)."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024")
    steps, _ = run_probe(tc, env, mode, "graph", "gmem:0:768m", "graph", "gmove:2:0", "inst:2", "gdel:2", "info",
                         "execdel:4", "info", "used")
    assert codes(steps) == [OK] * 10
    assert steps[6].values[0] == str(256 * MIB)  # the parent's executable graph holds the child's memory
    assert steps[8].values[0] == str(GIB)
    assert steps[9].values == ("0",)
