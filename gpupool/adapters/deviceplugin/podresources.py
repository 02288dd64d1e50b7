"""A client of kubelet's PodResources API (v1 ``List``) returning the services' snapshot type."""

from __future__ import annotations

import grpc

from gpupool.adapters.deviceplugin.api import POD_RESOURCES_SOCKET, podres_grpc, podres_pb
from gpupool.services.node_types import PodResourcesSnapshot


class PodResourcesClient:
    """Keeps one channel to ``socket`` and lists pod resources on demand."""

    def __init__(self, socket: str = POD_RESOURCES_SOCKET, timeout_s: float = 2.0) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None

    async def list(self) -> PodResourcesSnapshot:
        """One List call, as (namespace, name) → container → resource → device IDs."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket}")
        stub = podres_grpc.PodResourcesListerStub(self._channel)
        reply = await stub.List(podres_pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        out: dict[tuple[str, str], dict[str, dict[str, frozenset[str]]]] = {}
        for pod in reply.pod_resources:
            containers = out.setdefault((pod.namespace, pod.name), {})
            for c in pod.containers:
                containers[c.name] = {d.resource_name: frozenset(d.device_ids) for d in c.devices}
        return out

    async def close(self) -> None:
        """Close the channel."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
