"""A node agent serving its device plugins to a :class:`FakeKubelet`, in one event loop.

Why in the package: the node tests (in-memory pod source) and the end-to-end tests (pods from the
real apiserver) both need the same node — a fake kubelet in a private directory, the agent's
PodResources client, the plugin manager and the agent running, registration awaited — and the same
teardown; only the agent they build differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.deviceplugin.manager import DevicePluginManager
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.testing.fake_kubelet import FakeKubelet, FakePod

MakeAgent = Callable[[PodResourcesClient], NodeAgent]
"""Builds the agent, given the PodResources client that reads the fake kubelet."""


@dataclass
class FakeNode:
    """What :func:`agent_on_fake_kubelet` runs: the fake kubelet, the agent, its plugin manager, and
    the private directory holding their unix sockets."""

    kubelet: FakeKubelet
    agent: NodeAgent
    manager: DevicePluginManager
    dir: str


@contextlib.asynccontextmanager
async def agent_on_fake_kubelet(
    make_agent: MakeAgent, *, seed: int = 0, reject: Callable[[FakePod], str | None] | None = None,
    before_plugins: Callable[[NodeAgent], Awaitable[None]] | None = None, prefix: str = "gp",
) -> AsyncIterator[FakeNode]:
    """Start a fake kubelet (its random Go-map order seeded with ``seed``; ``reject`` may refuse
    pods at admission), the agent from ``make_agent`` and its plugins; wait until every resource
    the agent serves has registered. ``before_plugins`` runs once the agent exists and before its
    plugins start (``gpupool node-agent`` publishes the node's inventory there).

    Everything is stopped and the directory removed on exit.
    """
    base = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # unix socket paths must stay short
    kubelet = FakeKubelet(os.path.join(base, "dp"), os.path.join(base, "podres.sock"), random.Random(seed), reject)
    await kubelet.start()
    reader = PodResourcesClient(os.path.join(base, "podres.sock"))
    tasks: list[asyncio.Task[None]] = []
    try:
        agent = make_agent(reader)
        if before_plugins is not None:
            await before_plugins(agent)
        manager = DevicePluginManager(kubelet.plugin_dir, agent.resources, agent, poll_s=0.05)
        tasks = [asyncio.create_task(manager.run()), asyncio.create_task(agent.run())]
        await kubelet.wait_registered(len(agent.resources))
        yield FakeNode(kubelet, agent, manager, base)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await reader.close()
        await kubelet.stop()
        shutil.rmtree(base, ignore_errors=True)
