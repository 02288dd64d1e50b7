"""Registering with kubelet, and noticing when kubelet restarts.

Order matters: kubelet dials the plugin's socket as soon as Register returns, so each server must
already be serving. A kubelet restart re-creates ``kubelet.sock`` and wipes the plugin directory
(our sockets vanish); kubelet forgets every plugin, so the plugin must serve again and re-register.
``inotify`` is not in the standard library; polling ``stat`` every few hundred milliseconds finds
the change well within the "seconds" kubelet allows.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable

import grpc

from gpupool.nodeagent.deviceplugin.api import API_VERSION, pb, pb_grpc


class RegistrationError(RuntimeError):
    """kubelet refused the registration (wrong version, resource name taken) or is unreachable."""


async def register(kubelet_socket: str, endpoint: str, resource: str, timeout_s: float = 5.0) -> None:
    """Call ``Registration.Register`` for one resource; ``endpoint`` is the socket's file name."""
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
        stub = pb_grpc.RegistrationStub(channel)
        request = pb.RegisterRequest(
            version=API_VERSION, endpoint=endpoint, resource_name=resource,
            options=pb.DevicePluginOptions(pre_start_required=True,
                                           get_preferred_allocation_available=True))
        try:
            await stub.Register(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationError(f"kubelet refused {resource}: {exc.code().name} {exc.details()}") from exc


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_dev, st.st_ctime_ns)


async def wait_for_restart(kubelet_socket: str, own_sockets: Iterable[str], poll_s: float = 0.2) -> str:
    """Return (with a reason) once kubelet's socket is re-created or one of ours disappears."""
    own = list(own_sockets)
    baseline = _identity(kubelet_socket)
    while True:
        await asyncio.sleep(poll_s)
        now = _identity(kubelet_socket)
        if now != baseline:
            return "kubelet.sock re-created" if now is not None else "kubelet.sock removed"
        for path in own:
            if not os.path.exists(path):
                return f"{path} removed"


async def wait_for_socket(path: str, poll_s: float = 0.2) -> None:
    """Return once ``path`` exists (kubelet is up)."""
    while not os.path.exists(path):
        await asyncio.sleep(poll_s)
