"""What the fake kubelet (:mod:`gpupool.testing.fake_kubelet`) keeps: registered plugins, pods and
their started containers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import grpc


@dataclass
class Endpoint:
    """A registered plugin as kubelet keeps it."""

    resource: str
    socket: str
    options: Any
    channel: grpc.aio.Channel
    stub: Any
    healthy: set[str] = field(default_factory=set)
    unhealthy: set[str] = field(default_factory=set)
    healthy_counts: list[int] = field(default_factory=list)
    """The healthy device count of every ListAndWatch reply, in order: a test asks whether a short
    unhealthy spell reached kubelet at all, which sampling :meth:`FakeKubelet.allocatable` can miss
    on a loaded machine."""
    watch: asyncio.Task[None] | None = None


@dataclass
class ContainerRun:
    """A started container: its env, devices and mounts as the runtime would get them."""

    envs: dict[str, str]
    devices: list[str]
    conflicts: list[str]
    mounts: dict[str, tuple[str, bool]] = field(default_factory=dict)
    """Container path → (host path, read-only); the first response's mount of a path wins."""


@dataclass
class FakePod:
    """A pod as the fake kubelet keeps it (JSON spec plus kubelet-side state)."""

    uid: str
    namespace: str
    name: str
    created: float
    init: list[tuple[str, dict[str, int]]]
    app: list[tuple[str, dict[str, int]]]
    phase: str = "Pending"
    reason: str = ""
    runs: dict[str, ContainerRun] = field(default_factory=dict)
    sidecars: frozenset[str] = frozenset()
    """Init containers with ``restartPolicy: Always`` (native sidecars)."""

    def admission_order(self) -> list[tuple[str, dict[str, int], str]]:
        """(name, limits, kind) in kubelet's allocation order; kind is ``init``, ``sidecar`` or
        ``app``."""
        return ([(c, limits, "sidecar" if c in self.sidecars else "init") for c, limits in self.init]
                + [(c, limits, "app") for c, limits in self.app])


class AdmissionError(RuntimeError):
    """The device manager refuses a container: kubelet rejects the pod (UnexpectedAdmissionError)."""
