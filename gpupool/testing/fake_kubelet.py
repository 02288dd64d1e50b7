"""A fake kubelet that speaks the real gRPC protocols, modelled on kubelet 1.37.2 (and 1.35.4, which
behaves the same in everything modelled here) — the releases gpupool supports.

Used by the tests and the benchmark in place of a real kubelet. What it reproduces, because the
Allocate mapping depends on it (file and function names: docs/allocate-mapping.md):

* Registration server on ``<dir>/kubelet.sock``; on Register it dials the plugin's socket, asks
  GetDevicePluginOptions and follows ListAndWatch (healthy devices = allocatable). A resource that
  ever registered stays known across restarts (the device manager's checkpoint), with no healthy
  device until its plugin registers again.
* ``HandlePodAdditions``: each batch is sorted by creation time; each pod is added to the pod
  manager, then admitted; admission allocates init containers (native sidecars included) then app
  containers in spec order, one container at a time, each extended resource in random (Go map)
  order. A resource no plugin ever registered is skipped for any container (the admission
  predicate drops it, the device manager ignores it).
* ``devicesToAllocate`` holds the device-manager lock, but releases it while it waits for
  GetPreferredAllocation (so PodResources can be read from inside that call, as in kubelet); it
  takes reusable devices first (those of the pod's regular init containers), then the plugin's
  preference, then any free device. A container whose devices are already recorded gets no call
  at all (after a restart, on a resize). Allocate is called without the lock; the devices are
  recorded after it returns. A native sidecar's devices, like an app container's, are never
  reused by a later container.
* PodResources behind kubelet's rate limit (``podresources.DefaultQPS`` 100 calls per second,
  ``DefaultBurstTokens`` 10): a call beyond it is refused ``RESOURCE_EXHAUSTED``, "rejected by
  rate limit".
* PodResources v1 ``List`` over a unix socket: every *active* pod of the pod manager (a rejected or
  finished pod is not listed), its native sidecars and app containers, with their recorded device
  IDs (regular init containers are not listed).
* Pods of a batch start concurrently (pod workers): PreStartContainer per container and resource,
  then the env of the container is the merge of its resources' responses (first value wins; a
  differing value is recorded as a conflict).
* ``resize()``: an in-place resize of a pod (CPU and memory only): no plugin call.
* ``restart()``: kubelet is away for a moment (no Registration, no PodResources), the plugin
  directory is wiped and ``kubelet.sock`` re-created; plugins must register again. Checkpointed
  allocations survive. ``readmit()`` is the batch kubelet admits next: every active pod again, in
  creation order, without any plugin call, but a container that is not running (a finished init
  container) needs its resource's plugin registered with its devices healthy, or the pod is
  rejected (kubelet's re-registration race, docs/allocate-mapping.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from gpupool.nodeagent.deviceplugin.api import HEALTHY, KUBELET_SOCKET, pb, pb_grpc, podres_grpc, podres_pb
from gpupool.testing.fake_kubelet_types import AdmissionError, ContainerRun, Endpoint, FakePod

__all__ = ["AdmissionError", "ContainerRun", "Endpoint", "FakeKubelet", "FakePod"]


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
        """Recorded device IDs by (pod UID, container, resource); written by the device manager only
        (:meth:`_allocate_container`), tests read it."""
        self._devices_version = 0
        """Bumped on every write of :attr:`pod_devices`: a PodResources answer built at an older one is stale."""
        self._listing: tuple[tuple[int, tuple[str, ...]], Any] | None = None
        """The last PodResources answer and what it was built from (devices version, active pod UIDs)."""
        self.responses: dict[tuple[str, str, str], Any] = {}
        self.dm_lock = asyncio.Lock()
        self.admission = asyncio.Lock()
        self.workers: set[asyncio.Task[None]] = set()
        self.preferred_calls = 0
        self.allocate_calls = 0
        self.resizes = 0
        self.podresources_rejected = 0
        """PodResources calls refused by the rate limit."""
        self.podresources_limit = TokenBucket(PODRESOURCES_QPS, PODRESOURCES_BURST)
        """kubelet's PodResources rate limit (a test may slow it, as other clients drawing on it would)."""
        self.registered_resources: set[str] = set()
        """Resources whose plugin ever registered (the device manager's checkpoint keeps them)."""
        self.sources_ready = True
        """False from a restart until the batch after it was admitted (kubelet's ``sourcesReady``)."""
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

    async def drop_plugins(self) -> None:
        """Forget every registered plugin (what kubelet knows right after a restart, before the
        plugins registered again); their resources stay known, with no healthy device."""
        await self._drop_endpoints()

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
        dir wiped, both sockets re-created (a real kubelet is away for seconds). Recorded devices
        survive (the checkpoint); call :meth:`readmit` for the batch kubelet admits next."""
        for server in (self._reg_server, self._pr_server):
            if server is not None:
                await server.stop(0)
        self._reg_server = self._pr_server = None
        await self._drop_endpoints()
        self.sources_ready = False
        for name in os.listdir(self.plugin_dir):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(os.path.join(self.plugin_dir, name))
        await asyncio.sleep(downtime_s)
        await self.start()

    async def readmit(self) -> None:
        """The first batch after a restart: every active pod, in creation order, admitted again
        while sources are not ready. No plugin call for recorded devices, but a container that is
        not running (a finished regular init container) needs them registered and healthy, else
        the pod is rejected (``devicesToAllocate`` checks health before it sees nothing is needed)."""
        async with self.admission:
            for pod in sorted(self._active(), key=lambda p: p.created):
                for cname, limits, kind in pod.admission_order():
                    running = pod.phase == "Running" and kind != "init"
                    try:
                        await self._allocate_container(pod, cname, limits, {}, running=running)
                    except AdmissionError as exc:
                        pod.phase, pod.reason = "Failed", f"UnexpectedAdmissionError: {exc}"
                        break
            self.sources_ready = True

    async def resize(self, uid: str) -> None:
        """An in-place resize of pod ``uid`` (CPU and memory only: the API refuses a change of any
        other resource). kubelet 1.37 admits it with the resize operation, which its device manager
        ignores; 1.35 runs the device manager, which finds every container's devices recorded.
        Either way no plugin is called."""
        async with self.admission:
            pod = self.pod_manager[uid]
            for cname, limits, _kind in pod.admission_order():
                for resource, needed in limits.items():
                    known = self.pod_devices.get((uid, cname, resource))
                    if known is not None and len(known) != needed:
                        raise AdmissionError(f"{pod.name}/{cname} changed request for {resource}")
            self.resizes += 1

    def _active(self) -> list[FakePod]:
        return [p for p in self.pod_manager.values() if p.phase not in ("Failed", "Succeeded")]

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
        self.registered_resources.add(request.resource_name)
        first = asyncio.Event()
        ep.watch = asyncio.create_task(self._watch(ep, first))
        await asyncio.wait_for(first.wait(), 5)
        async with self.registered:
            self.registrations.append(request.resource_name)
            self.registered.notify_all()

    async def _watch(self, ep: Endpoint, first: asyncio.Event) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):  # the stream ended: kubelet stops watching
            async for reply in ep.stub.ListAndWatch(pb.Empty()):
                ep.healthy = {d.ID for d in reply.devices if d.health == HEALTHY}
                ep.unhealthy = {d.ID for d in reply.devices if d.health != HEALTHY}
                ep.healthy_counts.append(len(ep.healthy))
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
            self.sources_ready = True  # kubelet counts a source as seen once it handled an update

    async def _admit(self, pod: FakePod) -> str | None:
        reuse: dict[str, set[str]] = {}
        for cname, limits, kind in pod.admission_order():
            try:
                await self._allocate_container(pod, cname, limits, reuse)
            except Exception as exc:  # kubelet rejects the pod on any error of its device manager
                return f"UnexpectedAdmissionError: {exc}"
            for res in limits:
                devs = self.pod_devices.get((pod.uid, cname, res), frozenset())
                if kind == "init":  # a regular init container's devices are reusable by later ones
                    reuse.setdefault(res, set()).update(devs)
                else:  # a native sidecar's or app container's are its own for the pod's life
                    reuse.get(res, set()).difference_update(devs)
        return None

    def _prune_terminated(self) -> None:
        """UpdateAllocatedDevices: forget devices of pods that are no longer active."""
        gone = {uid for uid, p in self.pod_manager.items() if p.phase in ("Failed", "Succeeded")}
        for key in [k for k in self.pod_devices if k[0] in gone]:
            del self.pod_devices[key]

    def _allocated(self, resource: str) -> set[str]:
        active = {p.uid for p in self._active()}
        return {d for (uid, _c, r), devs in self.pod_devices.items() if r == resource and uid in active
                for d in devs}

    async def _allocate_container(self, pod: FakePod, cname: str, limits: Mapping[str, int],
                                  reuse: dict[str, set[str]], running: bool = False) -> None:
        resources = list(limits)
        self.rng.shuffle(resources)  # Go map iteration order
        for resource in resources:
            needed = limits[resource]
            if needed <= 0 or resource not in self.registered_resources:
                continue  # not a device-plugin resource: admission drops it, the device manager skips it
            ep, devs = await self._devices_to_allocate(pod, cname, resource, needed,
                                                       reuse.get(resource, set()), running)
            if ep is None or not devs:
                continue
            self.rng.shuffle(devs)
            self.allocate_calls += 1
            reply = await ep.stub.Allocate(pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=devs)]), timeout=10)
            async with self.dm_lock:
                self.pod_devices[(pod.uid, cname, resource)] = frozenset(devs)
                self._devices_version += 1
                self.responses[(pod.uid, cname, resource)] = reply.container_responses[0]

    async def _devices_to_allocate(self, pod: FakePod, cname: str, resource: str, needed: int,
                                   reusable: set[str], running: bool) -> tuple[Endpoint | None, list[str]]:
        """kubelet's ``devicesToAllocate``: the endpoint and the IDs to send in Allocate, or no IDs
        when nothing is to allocate. Raises :class:`AdmissionError` where kubelet fails the
        container."""
        await self.dm_lock.acquire()
        try:
            self._prune_terminated()
            known = self.pod_devices.get((pod.uid, cname, resource))
            if known is not None and len(known) != needed:
                raise AdmissionError(f"pod {pod.uid} container {cname} changed request for {resource}")
            if not self.sources_ready and running:
                return None, []  # kubelet restart: the container runs already, with its devices
            ep = self.endpoints.get(resource)
            healthy = ep.healthy if ep is not None else set()
            if ep is None or not healthy:
                raise AdmissionError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
            if known is not None:
                if not known <= healthy:
                    raise AdmissionError(f"previously allocated devices are no longer healthy {resource}")
                return ep, []  # recorded already: nothing to allocate
            chosen = list(reusable)[:needed]
            if len(chosen) < needed:
                available = healthy - self._allocated(resource) - set(chosen)
                if len(available) < needed - len(chosen):
                    raise AdmissionError(f"requested {needed} of {resource}, {len(available)} free")
                if ep.options.get_preferred_allocation_available:
                    self.preferred_calls += 1
                    req = pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=sorted(available | set(chosen)),
                        must_include_deviceIDs=sorted(chosen), allocation_size=needed)
                    self.dm_lock.release()  # callGetPreferredAllocationIfAvailable: unlocked RPC
                    try:
                        reply = await ep.stub.GetPreferredAllocation(
                            pb.PreferredAllocationRequest(container_requests=[req]), timeout=10)
                    finally:
                        await self.dm_lock.acquire()
                    preferred = [d for d in reply.container_responses[0].deviceIDs if d in available]
                    chosen += preferred[: needed - len(chosen)]
                rest = sorted(available - set(chosen))
                chosen += self.rng.sample(rest, needed - len(chosen))
            return ep, chosen
        finally:
            self.dm_lock.release()

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
        """PodResources List: active pods; native sidecars, then app containers, with their devices."""
        async with self.dm_lock:
            self._prune_terminated()  # List calls UpdateAllocatedDevices first
            active = self._active()
            # The answer depends on the recorded devices and the active pods alone (pruning drops
            # inactive pods' devices, which are not listed), so an unchanged node is answered with
            # the message built before: the agent lists on every Allocate, GetPreferredAllocation and
            # PreStartContainer, and rebuilding one message per device ID of every pod each time made
            # this fake the largest cost of the 200-pod mapping tests.
            basis = (self._devices_version, tuple(p.uid for p in active))
            if self._listing is not None and self._listing[0] == basis:
                return self._listing[1]
            out = []
            index: dict[tuple[str, str], list[tuple[str, frozenset[str]]]] = {}
            for (uid, c, r), ids in self.pod_devices.items():
                index.setdefault((uid, c), []).append((r, ids))
            for pod in active:
                containers = []
                for cname, _limits, kind in pod.admission_order():
                    if kind == "init":
                        continue
                    # one entry per device ID, as kubelet answers (no topology here)
                    devices = [podres_pb.ContainerDevices(resource_name=r, device_ids=[i])
                               for r, ids in index.get((pod.uid, cname), []) for i in sorted(ids)]
                    containers.append(podres_pb.ContainerResources(name=cname, devices=devices))
                out.append(podres_pb.PodResources(name=pod.name, namespace=pod.namespace,
                                                  containers=containers))
            reply = podres_pb.ListPodResourcesResponse(pod_resources=out)
            self._listing = (basis, reply)
            return reply


class _Registration(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, request: Any, context: Any) -> Any:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        asyncio.get_running_loop().create_task(self.kubelet.on_register(request))
        return pb.Empty()


#: kubelet's PodResources rate limit (pkg/kubelet/apis/podresources: DefaultQPS, DefaultBurstTokens).
PODRESOURCES_QPS = 100.0
PODRESOURCES_BURST = 10


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved: golang.org/x/time/rate's Allow, which
    kubelet's PodResources interceptor asks before each call."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.at = clock()

    def allow(self) -> bool:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class _PodResources(podres_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def List(self, request: Any, context: Any) -> Any:
        if not self.kubelet.podresources_limit.allow():
            self.kubelet.podresources_rejected += 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        return await self.kubelet.list_pod_resources()

