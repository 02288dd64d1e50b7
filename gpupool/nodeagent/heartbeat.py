"""The node agent's heartbeat: renew this node's agent Lease while the agent runs.

The extender stops placing GPU pods on a node whose agent Lease lapsed
(:mod:`gpupool.extender.liveness`); names and timings are in :mod:`gpupool.api.agent_lease`.

Why the renewal runs on the agent's own event loop (the API call itself in a thread): a loop that is
stuck answers no Allocate either, so it must not keep the node looking alive. The last Lease written
is kept and replaced directly (one request per renewal, as kubelet's node Lease does); a 404 or 409
drops it, and the next attempt reads or creates the Lease afresh. Nothing is released on exit: a
restarting agent (a DaemonSet roll-out) renews again well within the Lease's duration, and a
deleted Lease would read as "this node never ran an agent".
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpupool.api.agent_lease import (
    DEFAULT_LEASE_DURATION_S,
    DEFAULT_LEASE_NAMESPACE,
    DEFAULT_RENEW_INTERVAL_S,
    LEASE_COMPONENT,
    LEASE_LABEL,
    lease_name,
)

log = logging.getLogger(__name__)

#: After a failed renewal, try again this much sooner than the regular interval (never later than
#: it): a lapse needs several renewals missed in a row, so one failure must not cost a whole interval.
RETRY_FRACTION = 0.25


@dataclass(frozen=True)
class HeartbeatSettings:
    """Where and how often the agent renews its Lease."""

    namespace: str = DEFAULT_LEASE_NAMESPACE
    duration_s: int = DEFAULT_LEASE_DURATION_S
    renew_interval_s: float = DEFAULT_RENEW_INTERVAL_S

    def __post_init__(self) -> None:
        if self.duration_s < 1 or self.renew_interval_s <= 0:
            raise ValueError(f"lease duration must be >= 1 s and the renew interval > 0 s, "
                             f"got {self.duration_s} s and {self.renew_interval_s} s")
        if self.renew_interval_s >= self.duration_s:
            raise ValueError(f"the renew interval ({self.renew_interval_s:g} s) must be shorter than the lease "
                             f"duration ({self.duration_s} s), or the Lease lapses between renewals")


@dataclass
class HeartbeatStats:
    renewals: int = 0
    failures: int = 0


class AgentHeartbeat:
    """Creates and renews ``gpupool-agent-<node>`` with the official client's CoordinationV1Api."""

    def __init__(self, coordination_v1: Any, node: str, settings: HeartbeatSettings | None = None, *,
                 wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.api = coordination_v1
        self.node = node
        self.settings = settings or HeartbeatSettings()
        self.name = lease_name(node)
        self.wall = wall
        self.stats = HeartbeatStats()
        self._last: Any = None

    def _body(self, now: dt.datetime) -> Any:
        from kubernetes.client import V1Lease, V1LeaseSpec, V1ObjectMeta

        meta = V1ObjectMeta(name=self.name, namespace=self.settings.namespace,
                            labels={LEASE_LABEL: LEASE_COMPONENT})
        return V1Lease(metadata=meta, spec=V1LeaseSpec(
            holder_identity=self.node, lease_duration_seconds=self.settings.duration_s,
            acquire_time=now, renew_time=now))

    def renew_once(self) -> None:
        """One renewal (blocking); raises the client's exception when it fails."""
        from kubernetes.client.exceptions import ApiException

        now = self.wall()
        namespace = self.settings.namespace
        lease = self._last
        if lease is None:
            try:
                lease = self.api.read_namespaced_lease(self.name, namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                self._last = self.api.create_namespaced_lease(namespace, self._body(now))
                return
        spec = lease.spec
        spec.holder_identity = self.node
        spec.lease_duration_seconds = self.settings.duration_s
        spec.renew_time = now
        lease.metadata.labels = {**(lease.metadata.labels or {}), LEASE_LABEL: LEASE_COMPONENT}
        try:
            self._last = self.api.replace_namespaced_lease(self.name, namespace, lease)
        except ApiException as exc:
            if exc.status in (404, 409):  # deleted, or written by someone else: read it again next time
                self._last = None
            raise

    async def run(self, served: asyncio.Event | None = None) -> None:
        """Renew until cancelled; failures are logged and retried sooner.

        ``served`` is set while kubelet has accepted the agent's device plugins: a Lease renewed by
        an agent kubelet does not know (a wrong ``--plugin-dir``, a registration refused, kubelet
        restarted and not yet re-registered) would have the extender place pods that then run
        with no GPU grant. Renewals wait for it, so such a node's Lease lapses and filter refuses it.
        """
        interval = self.settings.renew_interval_s
        while True:
            if served is not None and not served.is_set():
                log.warning("node agent lease %s/%s not renewed until kubelet accepts the device plugins",
                            self.settings.namespace, self.name)
                await served.wait()
                log.info("device plugins registered: renewing node agent lease %s/%s again",
                         self.settings.namespace, self.name)
            try:
                await asyncio.to_thread(self.renew_once)
                self.stats.renewals += 1
                delay = interval
            except Exception as exc:  # the API may be away for a while: keep trying
                self.stats.failures += 1
                delay = interval * RETRY_FRACTION
                log.warning("renewing node agent lease %s/%s failed: %s", self.settings.namespace, self.name,
                            getattr(exc, "reason", None) or exc)
            await asyncio.sleep(delay)


def kube_heartbeat(node: str, kubeconfig: str | None, settings: HeartbeatSettings) -> AgentHeartbeat:
    """The heartbeat on the official client, configured as the agent's pod source is."""
    from kubernetes import client

    from gpupool.kube.client_config import api_configuration

    api_client = client.ApiClient(api_configuration(kubeconfig))
    api_client.user_agent = f"gpupool-node-agent/{node}"
    return AgentHeartbeat(client.CoordinationV1Api(api_client), node, settings)
