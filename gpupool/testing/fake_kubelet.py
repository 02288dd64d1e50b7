"""A fake kubelet that speaks the real gRPC protocols, modelled on kubelet 1.20's device manager.

Used by the tests and the benchmark in place of a real kubelet. What it reproduces, because the
Allocate mapping depends on it (pkg/kubelet/cm/devicemanager/manager.go, kubelet.go at v1.20):

* Registration server on ``<dir>/kubelet.sock``; on Register it dials the plugin's socket, asks
  GetDevicePluginOptions and follows ListAndWatch (healthy devices = allocatable).
* ``HandlePodAdditions``: each batch is sorted by creation time; each pod is added to the pod
  manager, then admitted; admission allocates init containers then app containers, one container at
  a time, each extended resource in random (Go map) order.
* ``devicesToAllocate`` holds the device-manager lock while it calls GetPreferredAllocation (so a
  PodResources List issued from inside GetPreferredAllocation would block — as in kubelet); it
  takes reusable init-container devices first, then the plugin's preference, then any free device.
  Allocate is called without the lock; the devices are recorded after it returns.
* PodResources v1 ``List`` over a unix socket: every pod in the pod manager, app containers only,
  with their recorded device IDs (taking the device-manager lock).
* Pods of a batch start concurrently (pod workers): PreStartContainer per container and resource,
  then the env of the container is the merge of its resources' responses (first value wins; a
  differing value is recorded as a conflict).
* ``restart()``: kubelet is away for a moment (no Registration, no PodResources), the plugin
  directory is wiped and ``kubelet.sock`` re-created; plugins must register again. Checkpointed
  allocations survive.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from gpupool.nodeagent.deviceplugin.api import HEALTHY, KUBELET_SOCKET, pb, pb_grpc, podres_grpc, podres_pb


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


class FakeKubelet:
    """One node's kubelet: registration, device manager, pod admission, PodResources."""

    def __init__(self, plugin_dir: str, podresources_socket: str, rng: random.Random | None = None,
                 reject: Callable[[FakePod], str | None] | None = None) -> None:
        self.plugin_dir = plugin_dir
        self.podresources_socket = podresources_socket
        self.rng = rng or random.Random(0)
        self.reject = reject
        self.endpoints: dict[str, Endpoint] = {}
        self.registrations: list[str] = []
        self.registered = asyncio.Condition()
        self.pod_manager: dict[str, FakePod] = {}
        self.pod_devices: dict[tuple[str, str, str], frozenset[str]] = {}
        self.responses: dict[tuple[str, str, str], Any] = {}
        self.dm_lock = asyncio.Lock()
        self.admission = asyncio.Lock()
        self.workers: set[asyncio.Task[None]] = set()
        self.preferred_calls = 0
        self._reg_server: grpc.aio.Server | None = None
        self._pr_server: grpc.aio.Server | None = None

    # ------------------------------------------------------------------ servers
    async def start(self) -> None:
        """Serve Registration on kubelet.sock and PodResources on its socket."""
        os.makedirs(self.plugin_dir, exist_ok=True)
        await self._start_registration()
        server = grpc.aio.server()
        podres_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), server)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.podresources_socket)
        server.add_insecure_port(f"unix://{self.podresources_socket}")
        await server.start()
        self._pr_server = server

    async def _start_registration(self) -> None:
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{os.path.join(self.plugin_dir, KUBELET_SOCKET)}")
        await server.start()
        self._reg_server = server

    async def stop(self) -> None:
        """Stop everything (pod workers, streams, servers)."""
        for task in list(self.workers):
            task.cancel()
        await self._drop_endpoints()
        for server in (self._reg_server, self._pr_server):
            if server is not None:
                await server.stop(0)
        self._reg_server = self._pr_server = None

    async def _drop_endpoints(self) -> None:
        for ep in self.endpoints.values():
            if ep.watch is not None:
                ep.watch.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await ep.watch
            await ep.channel.close()
        self.endpoints.clear()

    async def restart(self, downtime_s: float = 0.6) -> None:
        """kubelet restart: registration and PodResources servers gone for ``downtime_s``, plugin
        dir wiped, both sockets re-created (a real kubelet is away for seconds)."""
        for server in (self._reg_server, self._pr_server):
            if server is not None:
                await server.stop(0)
        self._reg_server = self._pr_server = None
        await self._drop_endpoints()
        for name in os.listdir(self.plugin_dir):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(os.path.join(self.plugin_dir, name))
        await asyncio.sleep(downtime_s)
        await self.start()

    async def on_register(self, request: Any) -> None:
        socket = os.path.join(self.plugin_dir, request.endpoint)
        channel = grpc.aio.insecure_channel(f"unix://{socket}",
                                            options=[("grpc.max_receive_message_length", 16 << 20)])
        stub = pb_grpc.DevicePluginStub(channel)
        options = await stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        old = self.endpoints.pop(request.resource_name, None)
        if old is not None and old.watch is not None:
            old.watch.cancel()
        ep = Endpoint(request.resource_name, socket, options, channel, stub)
        self.endpoints[request.resource_name] = ep
        first = asyncio.Event()
        ep.watch = asyncio.create_task(self._watch(ep, first))
        await asyncio.wait_for(first.wait(), 5)
        async with self.registered:
            self.registrations.append(request.resource_name)
            self.registered.notify_all()

    async def _watch(self, ep: Endpoint, first: asyncio.Event) -> None:
        async for reply in ep.stub.ListAndWatch(pb.Empty()):
            ep.healthy = {d.ID for d in reply.devices if d.health == HEALTHY}
            ep.unhealthy = {d.ID for d in reply.devices if d.health != HEALTHY}
            first.set()

    async def wait_registered(self, resources: int, count: int = 1, timeout: float = 10.0) -> None:
        """Until ``resources`` resources registered ``count`` times each (in total)."""
        async with self.registered:
            await asyncio.wait_for(self.registered.wait_for(
                lambda: len(self.registrations) >= resources * count and len(self.endpoints) >= resources),
                timeout)

    def allocatable(self, resource: str) -> int:
        ep = self.endpoints.get(resource)
        return len(ep.healthy) if ep else 0

    # ------------------------------------------------------------------ admission
    async def handle_pod_additions(self, pods: list[FakePod]) -> None:
        """kubelet's HandlePodAdditions for one batch (serial per node across batches)."""
        async with self.admission:
            for pod in sorted(pods, key=lambda p: p.created):
                self.pod_manager[pod.uid] = pod
                reason = self.reject(pod) if self.reject else None
                if reason is None:
                    reason = await self._admit(pod)
                if reason is not None:
                    pod.phase, pod.reason = "Failed", reason
                    continue
                task = asyncio.create_task(self._pod_worker(pod))
                self.workers.add(task)
                task.add_done_callback(self.workers.discard)

    async def _admit(self, pod: FakePod) -> str | None:
        reuse: dict[str, set[str]] = {}
        for init, (cname, limits) in [(True, c) for c in pod.init] + [(False, c) for c in pod.app]:
            try:
                await self._allocate_container(pod, cname, limits, reuse)
            except Exception as exc:
                return f"UnexpectedAdmissionError: {exc}"
            for res in limits:
                devs = self.pod_devices.get((pod.uid, cname, res), frozenset())
                if init:
                    reuse.setdefault(res, set()).update(devs)
                else:
                    reuse.get(res, set()).difference_update(devs)
        return None

    def _prune_terminated(self) -> None:
        """UpdateAllocatedDevices: forget devices of pods that are no longer active."""
        gone = {uid for uid, p in self.pod_manager.items() if p.phase in ("Failed", "Succeeded")}
        for key in [k for k in self.pod_devices if k[0] in gone]:
            del self.pod_devices[key]

    def _allocated(self, resource: str) -> set[str]:
        active = {uid for uid, p in self.pod_manager.items() if p.phase not in ("Failed", "Succeeded")}
        return {d for (uid, _c, r), devs in self.pod_devices.items() if r == resource and uid in active
                for d in devs}

    async def _allocate_container(self, pod: FakePod, cname: str, limits: Mapping[str, int],
                                  reuse: dict[str, set[str]]) -> None:
        resources = list(limits)
        self.rng.shuffle(resources)  # Go map iteration order
        for resource in resources:
            needed = limits[resource]
            if needed <= 0:
                continue
            ep = self.endpoints.get(resource)
            if ep is None and cname in {c for c, _ in pod.app}:
                continue  # removeMissingExtendedResources: an app container's unadvertised names are dropped
            if ep is None:
                raise RuntimeError(f"unknown resource {resource}")
            async with self.dm_lock:
                self._prune_terminated()
                chosen = list(reuse.get(resource, set()))[:needed]
                if len(chosen) < needed:
                    available = ep.healthy - self._allocated(resource) - set(chosen)
                    if len(available) < needed - len(chosen):
                        raise RuntimeError(f"requested {needed} of {resource}, {len(available)} free")
                    if ep.options.get_preferred_allocation_available:
                        self.preferred_calls += 1
                        req = pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=sorted(available | set(chosen)),
                            must_include_deviceIDs=sorted(chosen), allocation_size=needed)
                        reply = await ep.stub.GetPreferredAllocation(
                            pb.PreferredAllocationRequest(container_requests=[req]), timeout=10)
                        preferred = [d for d in reply.container_responses[0].deviceIDs if d in available]
                        chosen += preferred[: needed - len(chosen)]
                    rest = sorted(available - set(chosen))
                    chosen += self.rng.sample(rest, needed - len(chosen))
            devs = list(chosen)
            self.rng.shuffle(devs)
            reply = await ep.stub.Allocate(pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=devs)]), timeout=10)
            async with self.dm_lock:
                self.pod_devices[(pod.uid, cname, resource)] = frozenset(devs)
                self.responses[(pod.uid, cname, resource)] = reply.container_responses[0]

    async def _pod_worker(self, pod: FakePod) -> None:
        for cname, limits in pod.init + pod.app:
            envs: dict[str, str] = {}
            devices: list[str] = []
            conflicts: list[str] = []
            mounts: dict[str, tuple[str, bool]] = {}
            for resource in limits:
                key = (pod.uid, cname, resource)
                if key not in self.responses:
                    continue
                ep = self.endpoints.get(resource)
                if ep is not None and ep.options.pre_start_required:
                    await ep.stub.PreStartContainer(pb.PreStartContainerRequest(
                        devices_ids=sorted(self.pod_devices[key])), timeout=10)
                resp = self.responses[key]
                for k, v in resp.envs.items():
                    if k in envs and envs[k] != v:
                        conflicts.append(f"{k}: {envs[k]} vs {v}")
                    envs.setdefault(k, v)
                for d in resp.devices:
                    if d.container_path not in devices:
                        devices.append(d.container_path)
                for m in resp.mounts:  # kubelet keeps the first mount of a path, logs a different one
                    mount = (m.host_path, m.read_only)
                    if m.container_path in mounts and mounts[m.container_path] != mount:
                        conflicts.append(f"mount {m.container_path}: {mounts[m.container_path]} vs {mount}")
                    mounts.setdefault(m.container_path, mount)
            pod.runs[cname] = ContainerRun(envs, devices, conflicts, mounts)
        pod.phase = "Running"

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Until admission is done and every pod worker finished."""
        async def idle() -> None:
            while True:
                async with self.admission:
                    pass
                if not self.workers:
                    return
                await asyncio.gather(*list(self.workers), return_exceptions=True)
        await asyncio.wait_for(idle(), timeout)

    async def list_pod_resources(self) -> Any:
        async with self.dm_lock:
            out = []
            index: dict[tuple[str, str], list[tuple[str, frozenset[str]]]] = {}
            for (uid, c, r), ids in self.pod_devices.items():
                index.setdefault((uid, c), []).append((r, ids))
            for pod in self.pod_manager.values():
                containers = []
                for cname, _limits in pod.app:
                    devices = [podres_pb.ContainerDevices(resource_name=r, device_ids=sorted(ids))
                               for r, ids in index.get((pod.uid, cname), [])]
                    containers.append(podres_pb.ContainerResources(name=cname, devices=devices))
                out.append(podres_pb.PodResources(name=pod.name, namespace=pod.namespace,
                                                  containers=containers))
            return podres_pb.ListPodResourcesResponse(pod_resources=out)


class _Registration(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, request: Any, context: Any) -> Any:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        asyncio.get_running_loop().create_task(self.kubelet.on_register(request))
        return pb.Empty()


class _PodResources(podres_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def List(self, request: Any, context: Any) -> Any:
        return await self.kubelet.list_pod_resources()

