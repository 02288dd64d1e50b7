"""A client of kubelet's PodResources API (v1 ``List``) returning the services' snapshot type.

kubelet's PodResources server goes away while kubelet restarts. A gRPC channel that failed to
connect then waits out an exponential reconnect backoff (up to two minutes by default) and fails
every call fast in the meantime, so the first Allocate after a kubelet restart was refused with
UNAVAILABLE although kubelet was back. The socket is local: the channel retries quickly (short
backoff), and a call that still finds it unavailable is retried once on a fresh channel.

kubelet rate-limits the PodResources API (since 1.27: a token bucket of 100 calls per second with
a burst of 10, answered ``RESOURCE_EXHAUSTED``, "rejected by rate limit"). The agent lists on every
Allocate and GetPreferredAllocation, so a batch of GPU pods (three resources per container, each
with both calls) empties the burst and kubelet rejected a pod with that error
(UnexpectedAdmissionError). Each call now waits for a token of a bucket the client keeps like
kubelet's (``call_pacing.py``), and a call kubelet still rejects (another client drew its tokens)
is retried after a short pause, while its time lasts.

Those many Lists each name every device of every pod, one message per device ID: reading them
cost ~25 ms of Python per List on a node of 200 pods (23,000 entries), three times per container
and resource while kubelet waits. Between two Lists almost every pod is unchanged, so each pod's
entry is read once and found again by its bytes.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from gpupool.nodeagent.deviceplugin.api import POD_RESOURCES_SOCKET, podres_grpc, podres_pb
from gpupool.nodeagent.deviceplugin.call_pacing import CallPacer
from gpupool.nodeagent.types import PodResourcesSnapshot

PodContainers = dict[str, dict[str, frozenset[str]]]
"""One pod's listed containers: container → resource → device IDs."""

#: First pause after kubelet's rate limit refused a List; doubled on each refusal, up to the last
#: (one token comes back every 10 ms at kubelet's 100 calls per second).
RATE_LIMITED_FIRST_PAUSE_S = 0.01
RATE_LIMITED_LAST_PAUSE_S = 0.16

#: Reconnect quickly to the local socket (gRPC's defaults are 1 s initial, 120 s maximum).
_CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000))


class PodResourcesClient:
    """Keeps one channel to ``socket`` and lists pod resources on demand."""

    def __init__(self, socket: str = POD_RESOURCES_SOCKET, timeout_s: float = 2.0,
                 pacer: CallPacer | None = None) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        self.pacer = pacer if pacer is not None else CallPacer()
        """Spaces the calls at kubelet's rate limit, so they are not sent to be refused."""
        self._channel: grpc.aio.Channel | None = None
        self.rate_limited = 0
        """Lists kubelet refused by its rate limit and this client retried."""
        self._read: dict[bytes, PodContainers] = {}
        """Each pod of the last List by its serialized entry: what it was read as (never mutated)."""
        self._pending: asyncio.Task[PodResourcesSnapshot] | None = None
        """The List not sent yet (waiting for its token), which a new caller joins."""

    def _stub(self) -> podres_grpc.PodResourcesListerStub:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket}", options=_CHANNEL_OPTIONS)
        return podres_grpc.PodResourcesListerStub(self._channel)

    async def list(self) -> PodResourcesSnapshot:
        """kubelet's answer to a List sent after this call began, as (namespace, name) → container →
        resource → device IDs.

        A List waiting for its token is shared by every caller that asks before it is sent: its
        answer shows kubelet's state at sending, after each of their calls began, which is all a
        caller needs (pods starting together, each in PreStartContainer, take one token instead of
        one each). A caller that gives up (GetPreferredAllocation's deadline) leaves the List to the
        others."""
        pending = self._pending
        if pending is None:
            pending = self._pending = asyncio.get_running_loop().create_task(self._list_paced())
            pending.add_done_callback(self._finished)
        return await asyncio.shield(pending)

    async def _list_paced(self) -> PodResourcesSnapshot:
        request = podres_pb.ListPodResourcesRequest()
        deadline = time.monotonic() + self.timeout_s
        pause = RATE_LIMITED_FIRST_PAUSE_S
        this = asyncio.current_task()
        while True:
            wait = self.pacer.reserve()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._pending is this:
                self._pending = None  # sent from here on: a later caller needs a later List
            try:
                reply = await self._list_once(request)
                break
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                self.pacer.refused()
                if time.monotonic() + pause >= deadline:
                    raise
            self.rate_limited += 1
            await asyncio.sleep(pause)
            pause = min(pause * 2, RATE_LIMITED_LAST_PAUSE_S)
        out: dict[tuple[str, str], PodContainers] = {}
        read: dict[bytes, PodContainers] = {}
        for pod in reply.pod_resources:
            raw = pod.SerializeToString(deterministic=True)
            containers = self._read.get(raw)
            if containers is None:
                containers = read_pod(pod)
            read[raw] = containers
            key = (pod.namespace, pod.name)
            # A pod listed twice: its containers are joined, a later entry's winning a name.
            out[key] = {**out[key], **containers} if key in out else containers
        self._read = read
        return out

    def _finished(self, task: asyncio.Task[PodResourcesSnapshot]) -> None:
        """A List that ended before it was sent (failed while waiting) is joined by nobody after; its
        failure is marked seen, as its callers may all have gone (each got it, or gave up)."""
        if self._pending is task:
            self._pending = None
        if not task.cancelled():
            task.exception()

    async def _list_once(self, request: podres_pb.ListPodResourcesRequest) -> podres_pb.ListPodResourcesResponse:
        reply: podres_pb.ListPodResourcesResponse
        try:
            reply = await self._stub().List(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            await self.close()  # a fresh channel connects at once instead of waiting out a backoff
            reply = await self._stub().List(request, timeout=self.timeout_s, wait_for_ready=True)
        return reply

    async def close(self) -> None:
        """Close the channel."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def read_pod(pod: podres_pb.PodResources) -> PodContainers:
    """One pod's entry of a List as container → resource → device IDs."""
    containers: PodContainers = {}
    for c in pod.containers:
        # kubelet sends one ContainerDevices per device ID (and per NUMA node of it:
        # containerDevicesFromResourceDeviceInstances, pkg/kubelet/cm/container_manager.go)
        ids: dict[str, list[str]] = {}
        for d in c.devices:
            got = ids.get(d.resource_name)
            if got is None:
                got = ids[d.resource_name] = []
            got.extend(d.device_ids)
        containers[c.name] = {r: frozenset(v) for r, v in ids.items()}
    return containers
