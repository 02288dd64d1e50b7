"""The DRA kubelet plugin's gRPC server: plugin registration and the DRAPlugin service on one socket.

kubelet's plugin watcher finds the socket in ``<kubelet dir>/plugins_registry``, asks GetInfo and
reports the outcome with NotifyRegistrationStatus. GetInfo leaves the endpoint empty, which tells
kubelet to call the DRA service on the same socket: the path kubelet dials is then the one it found
itself, right in whatever mount namespace kubelet runs. The servicers only translate between
protobuf and :class:`~gpupool.nodeagent.dra.claim_state.ClaimState`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

import grpc

from gpupool.nodeagent.dra.api import DRA_SERVICE, PLUGIN_TYPE, dra_grpc, dra_pb, reg_grpc, reg_pb
from gpupool.nodeagent.dra.claim_allocation import ClaimRef
from gpupool.nodeagent.dra.claim_state import ClaimState

log = logging.getLogger(__name__)


class _Registration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, driver: str, registered: asyncio.Event) -> None:
        self.driver = driver
        self.registered = registered
        self.last_error = ""

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb.PluginInfo(type=PLUGIN_TYPE, name=self.driver, endpoint="", supported_versions=[DRA_SERVICE])

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            log.info("kubelet registered DRA driver %s", self.driver)
            self.last_error = ""
            self.registered.set()
        else:
            log.error("kubelet refused DRA driver %s: %s", self.driver, request.error)
            self.last_error = request.error
            self.registered.clear()
        return reg_pb.RegistrationStatusResponse()


class _DraPlugin(dra_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, state: ClaimState) -> None:
        self.state = state

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        answers = await self.state.prepare([_ref(c) for c in request.claims])
        claims = {}
        for uid, answer in answers.items():
            if isinstance(answer, str):
                claims[uid] = dra_pb.NodePrepareResourceResponse(error=answer)
                continue
            devices = [dra_pb.Device(request_names=list(d.requests), pool_name=d.pool, device_name=d.device,
                                     cdi_device_ids=list(d.cdi_ids),
                                     **({"share_id": d.share_id} if d.share_id else {})) for d in answer]
            claims[uid] = dra_pb.NodePrepareResourceResponse(devices=devices)
        return dra_pb.NodePrepareResourcesResponse(claims=claims)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        answers = await self.state.unprepare([_ref(c) for c in request.claims])
        return dra_pb.NodeUnprepareResourcesResponse(
            claims={uid: dra_pb.NodeUnprepareResourceResponse(error=error) for uid, error in answers.items()})


def _ref(claim: Any) -> ClaimRef:
    return ClaimRef(claim.namespace, claim.name, claim.uid)


class DraPluginServer:
    """Serves registration and the DRA service for ``driver`` on ``socket_path``."""

    def __init__(self, driver: str, socket_path: str, state: ClaimState) -> None:
        self.driver = driver
        self.socket_path = socket_path
        self.state = state
        self.registered = asyncio.Event()
        """Set once kubelet reports the driver registered; cleared when it refuses it."""
        self._registration = _Registration(driver, self.registered)
        self._server: grpc.aio.Server | None = None

    @property
    def refusal(self) -> str:
        """kubelet's last reason for refusing the registration ("" when none)."""
        return self._registration.last_error

    async def start(self) -> None:
        """Remove a stale socket, bind, serve."""
        os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(self._registration, server)
        dra_grpc.add_DRAPluginServicer_to_server(_DraPlugin(self.state), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        log.info("DRA driver %s serving on %s", self.driver, self.socket_path)

    async def stop(self, grace: float = 0.2) -> None:
        """Stop serving and remove the socket (kubelet deregisters the driver)."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        self.registered.clear()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    async def run(self, poll_s: float = 1.0) -> None:
        """Serve until cancelled; serve again when the socket disappears (someone cleaned the
        registry directory: kubelet forgot the driver, a new socket makes it register again)."""
        try:
            await self.start()
            while True:
                await asyncio.sleep(poll_s)
                if not os.path.exists(self.socket_path):
                    log.warning("DRA registration socket %s disappeared; serving again", self.socket_path)
                    await self.stop()
                    await self.start()
        finally:
            await self.stop()
