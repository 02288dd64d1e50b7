"""The interception library's probe in a real container: an image with the stand-in driver and the
probe, and a node agent enforcing with the library, as the shim's real-container e2e tests use them.

The tests differ in what the pod asks and what the probe does; the image, the library the agent
preloads and the wait for the agent's devices are the same, so they live here once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from gpupool.api.names import ResourceNames
from gpupool.shim.build import RELEASE, ShimBuildError, find_compiler
from gpupool.testenv.images import LIB_DIR, build_image
from gpupool.testenv.kubelet import Kubelet
from tests.e2e.e2e_support import NodeAgentProcess, wait_for
from tests.e2e.real_containers import stand_in_cards
from tests.shim.toolchain import Toolchain, build_toolchain

NAMES = ResourceNames()
PROBE = "/usr/local/bin/probe"
#: The stand-in driver keeps its card timeline in a file; the per-container directory is the one
#: place the container surely may write.
STANDIN_STATE = "/var/run/gpupool/standin.state"


def probe_image(name: str, kubelet: Kubelet, out: Path) -> tuple[Toolchain, str]:
    """The library's toolchain built into ``out`` and an image ``name`` with the stand-in driver
    (``libcuda.so.1``, ``libnvidia-ml.so.1``) and the probe, imported into ``kubelet``; the image's
    reference. Skips the test where no C compiler can build the library."""
    try:
        find_compiler()
    except ShimBuildError as exc:
        pytest.skip(f"cannot build the interception library here: {exc}")
    tc = build_toolchain(RELEASE, out)
    image = build_image(name, {f"{LIB_DIR}/libcuda.so.1": tc.standin / "libcuda.so.1",
                               f"{LIB_DIR}/libnvidia-ml.so.1": tc.standin / "libnvidia-ml.so.1",
                               PROBE: tc.probe})
    kubelet.import_image(image)
    return tc, image.ref


def shim_agent(start_node_agent: Callable[..., NodeAgentProcess], kubelet: Kubelet, core_v1: client.CoreV1Api,
               tc: Toolchain, cards_dir: Path, state_dir: Path, *extra_args: str,
               card_mib: int = 16384) -> NodeAgentProcess:
    """``gpupool node-agent --isolation shim`` with the toolchain's library on stand-in cards of
    ``card_mib``, once kubelet advertises all of their memory."""
    agent = start_node_agent(kubelet, stand_in_cards(cards_dir, memory_mib=card_mib),
                             ("--isolation", "shim", "--shim-library", tc.preload, "--state-dir", str(state_dir),
                              *extra_args))
    node = kubelet.node_name
    wait_for(lambda: (core_v1.read_node(node).status.allocatable or {}).get(NAMES.gpu_mem) == str(2 * card_mib // 256),
             timeout=60, what=f"gpupool devices on {node}\n{agent.log()}")
    return agent
