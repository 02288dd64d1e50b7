"""One device-plugin gRPC server per resource, on its own unix socket in kubelet's plugin dir.

kubelet keeps one endpoint per resource name, so gpupool runs one small server per resource (gpu,
gpu-mem, gpu-core, gpu-shared, and the foreign aliases it is asked to serve) that all delegate to the
same :class:`AllocationHandler` (the node agent). The servicer
only translates between protobuf and the handler's typed calls; errors become gRPC status codes
with the handler's message, which kubelet copies into the pod's admission failure.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import grpc

from gpupool.nodeagent.deviceplugin.api import HEALTHY, UNHEALTHY, pb, pb_grpc
from gpupool.nodeagent.types import ContainerGrant, StartRefused

log = logging.getLogger(__name__)


class AllocationHandler(Protocol):
    """What the servers need from the node agent."""

    def device_list(self, resource: str) -> list[tuple[str, bool]]:
        """(device ID, healthy) of every device of ``resource`` now."""
        ...

    async def wait_devices_changed(self, seen_version: int) -> int:
        """Return the device-list version once it differs from ``seen_version``."""
        ...

    @property
    def devices_version(self) -> int:
        """The current device-list version."""
        ...

    async def preferred(self, resource: str, available: Sequence[str], must_include: Sequence[str],
                        size: int) -> list[str]:
        """A preferred set of ``size`` device IDs (advisory; answers within about a second)."""
        ...

    async def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerGrant:
        """The grant for the container that kubelet is allocating these devices to."""
        ...

    async def pre_start(self, resource: str, device_ids: Sequence[str]) -> None:
        """Called before each container start; used to verify and reconcile. Raises
        :class:`StartRefused` to keep the container from starting."""
        ...


class _Servicer(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, resource: str, handler: AllocationHandler) -> None:
        self.resource = resource
        self.handler = handler

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        version = -1
        while True:
            version = self.handler.devices_version
            devices = [pb.Device(ID=i, health=HEALTHY if ok else UNHEALTHY)
                       for i, ok in self.handler.device_list(self.resource)]
            yield pb.ListAndWatchResponse(devices=devices)
            await self.handler.wait_devices_changed(version)

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        responses = []
        for req in request.container_requests:
            ids = await self.handler.preferred(self.resource, list(req.available_deviceIDs),
                                               list(req.must_include_deviceIDs), int(req.allocation_size))
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: Any, context: Any) -> Any:
        responses = []
        for req in request.container_requests:
            try:
                grant = await self.handler.allocate(self.resource, list(req.devices_ids))
            except LookupError as exc:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            except ValueError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            responses.append(pb.ContainerAllocateResponse(
                envs=dict(grant.envs), annotations=dict(grant.annotations),
                mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path,
                                 read_only=m.read_only) for m in grant.mounts],
                devices=[pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path,
                                       permissions=d.permissions) for d in grant.devices]))
        return pb.AllocateResponse(container_responses=responses)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        try:
            await self.handler.pre_start(self.resource, list(request.devices_ids))
        except StartRefused as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.PreStartContainerResponse()


class ResourcePluginServer:
    """Serves the DevicePlugin service for one resource on ``socket_path``."""

    def __init__(self, resource: str, socket_path: str, handler: AllocationHandler) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self.handler = handler
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Remove a stale socket, bind, serve."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = grpc.aio.server(options=[("grpc.max_send_message_length", 16 << 20)])
        pb_grpc.add_DevicePluginServicer_to_server(_Servicer(self.resource, self.handler), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        log.info("serving %s on %s", self.resource, self.socket_path)

    async def stop(self, grace: float = 0.2) -> None:
        """Stop serving (open ListAndWatch streams are cancelled) and remove the socket."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
