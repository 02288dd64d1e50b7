"""A fake kubelet for the DRA kubelet plugin, speaking the real gRPC protocols (modelled on kubelet
1.37.2's plugin watcher and DRA manager, ``pkg/kubelet/pluginmanager`` and ``pkg/kubelet/cm/dra``).

What it reproduces:

* registration: dial a socket found in the registry directory, ``GetInfo``; the type must be
  ``DRAPlugin``, ``supported_versions`` must name a service kubelet knows (``v1.DRAPlugin``,
  ``v1beta1.DRAPlugin``), an empty endpoint means the registration socket itself; then
  ``NotifyRegistrationStatus`` with the outcome;
* ``NodePrepareResources`` / ``NodeUnprepareResources`` for a batch of claims on the endpoint,
  answered per claim UID (a claim missing from the answer is an error, as in kubelet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from gpupool.nodeagent.dra.api import dra_grpc, dra_pb, reg_grpc, reg_pb

#: The DRA services kubelet 1.37 can call, newest first.
KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


class FakeDraKubeletError(RuntimeError):
    """What kubelet would refuse or report (registration refused, a claim left unanswered)."""


@dataclass(frozen=True)
class ClaimName:
    """A claim as kubelet names it in a call."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedAnswer:
    """One claim's prepare answer: its devices (request names, pool, device, CDI IDs, share ID) or an error."""

    devices: tuple[tuple[tuple[str, ...], str, str, tuple[str, ...], str | None], ...]
    error: str


@dataclass
class FakeDraKubelet:
    """Registers plugins and calls them."""

    drivers: dict[str, str] = field(default_factory=dict)
    """Driver name → endpoint, for every registered plugin."""

    async def register(self, registration_socket: str) -> str:
        """Register the plugin behind ``registration_socket``; its driver name."""
        async with grpc.aio.insecure_channel(f"unix://{registration_socket}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg_pb.InfoRequest(), timeout=5)
            error = ""
            if info.type != "DRAPlugin":
                error = f"no handler registered for plugin type: {info.type}"
            elif not any(s in KUBELET_SERVICES for s in info.supported_versions):
                error = (f"none of services supported by the plugin ({list(info.supported_versions)}) are "
                         f"supported by the kubelet ({list(KUBELET_SERVICES)})")
            await stub.NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=not error, error=error), timeout=5)
        if error:
            raise FakeDraKubeletError(error)
        self.drivers[info.name] = info.endpoint or registration_socket
        return str(info.name)

    async def prepare(self, driver: str, claims: Sequence[ClaimName]) -> dict[str, PreparedAnswer]:
        """``NodePrepareResources`` for ``claims``; UID → answer."""
        request = dra_pb.NodePrepareResourcesRequest(claims=[_claim(c) for c in claims])
        async with grpc.aio.insecure_channel(f"unix://{self._endpoint(driver)}") as channel:
            reply = await dra_grpc.DRAPluginStub(channel).NodePrepareResources(request, timeout=45)
        out = {}
        for claim in claims:
            if claim.uid not in reply.claims:
                raise FakeDraKubeletError(f"NodePrepareResources skipped claim {claim.uid}")
            answer = reply.claims[claim.uid]
            out[claim.uid] = PreparedAnswer(
                tuple((tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids),
                       d.share_id if d.HasField("share_id") else None) for d in answer.devices), answer.error)
        return out

    async def unprepare(self, driver: str, claims: Sequence[ClaimName]) -> dict[str, str]:
        """``NodeUnprepareResources`` for ``claims``; UID → error ("" for done)."""
        request = dra_pb.NodeUnprepareResourcesRequest(claims=[_claim(c) for c in claims])
        async with grpc.aio.insecure_channel(f"unix://{self._endpoint(driver)}") as channel:
            reply = await dra_grpc.DRAPluginStub(channel).NodeUnprepareResources(request, timeout=45)
        missing = [c.uid for c in claims if c.uid not in reply.claims]
        if missing:
            raise FakeDraKubeletError(f"NodeUnprepareResources skipped claims {missing}")
        return {c.uid: reply.claims[c.uid].error for c in claims}

    def _endpoint(self, driver: str) -> str:
        if driver not in self.drivers:
            raise FakeDraKubeletError(f"DRA driver {driver} is not registered")
        return self.drivers[driver]


def _claim(claim: ClaimName) -> Any:
    return dra_pb.Claim(namespace=claim.namespace, name=claim.name, uid=claim.uid)
