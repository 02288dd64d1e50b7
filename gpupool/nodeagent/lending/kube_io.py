"""The lending service's API calls: evict a reclaimed pod, post its Warning, write ``lendable``.

Eviction goes through the Eviction subresource, so PodDisruptionBudgets are asked and the pod's
controller sees an ordinary eviction; ``policy/v1`` first, ``policy/v1beta1`` for API servers
before 1.22. A refused eviction (429: a budget would be broken; 500 on a budget misconfiguration)
falls back to a delete. Both ask for no grace period: a pod is evicted only after every process
of it was stopped, so nothing is left for a grace period to protect, and a pod object left
Terminating until kubelet finalises it (4-8 s measured) keeps its booking on the loan in the
extender's ledger: a borrower placed when the owner idles again would find the loan taken by a
pod that no longer runs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from gpupool.api.lending import LendingNames
from gpupool.kube.client_config import api_configuration
from gpupool.kube.podapi import pod_event

log = logging.getLogger(__name__)

USER_AGENT = "gpupool-node-agent"
EVICTION_VERSIONS = ("policy/v1", "policy/v1beta1")
GRACE_S = 0
"""Grace period of the eviction and of the fallback delete (see the module docstring)."""
_NOT_FOUND = 404
_TOO_MANY = 429


class KubeLending:
    """:class:`~gpupool.nodeagent.lending.reclaim.PodEvictor` and the annotation writer over the API."""

    def __init__(self, node: str, names: LendingNames, kubeconfig: str | None = None) -> None:
        import kubernetes

        client = cast(Any, kubernetes).client
        api_client = client.ApiClient(api_configuration(kubeconfig))
        api_client.user_agent = f"{USER_AGENT}/{node}"
        self._api = client.CoreV1Api(api_client)
        self._error = client.exceptions.ApiException
        self.node = node
        self.names = names

    async def evict(self, namespace: str, name: str) -> str:
        """Evict the pod; ``evicted``, ``deleted`` (eviction refused) or ``gone``."""
        for version in EVICTION_VERSIONS:
            body = {"apiVersion": version, "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                    "deleteOptions": {"gracePeriodSeconds": GRACE_S}}
            try:
                await asyncio.to_thread(self._api.create_namespaced_pod_eviction, name, namespace, body)
                return "evicted"
            except self._error as exc:
                if exc.status != _TOO_MANY and version != EVICTION_VERSIONS[-1]:
                    continue  # this API server may not know the version: try the older one
                if exc.status == _NOT_FOUND:
                    return "gone"
                log.warning("eviction of %s/%s refused (%s); deleting it", namespace, name, exc.status)
                break
        try:
            await asyncio.to_thread(self._api.delete_namespaced_pod, name, namespace,
                                    grace_period_seconds=GRACE_S)
        except self._error as exc:
            if exc.status == _NOT_FOUND:
                return "gone"
            raise
        return "deleted"

    async def warn(self, namespace: str, name: str, reason: str, message: str) -> None:
        """A Warning event about the pod from the node agent."""
        body = pod_event(namespace, name, "", reason, message)
        body["source"] = {"component": USER_AGENT, "host": self.node}
        await asyncio.to_thread(self._api.create_namespaced_event, namespace, body)

    async def write_lendable(self, value: str | None) -> None:
        """Set (or, with ``None``, remove) the node's ``lendable`` annotation."""
        patch = {"metadata": {"annotations": {self.names.lendable: value}}}
        await asyncio.to_thread(self._api.patch_node, self.node, patch)
