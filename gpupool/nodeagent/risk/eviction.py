"""Evict a pod through the Eviction API (``--risk-action evict``).

An eviction, unlike a delete, honours the pod's PodDisruptionBudget and grace period; a refusal (429
while the budget allows none) is raised to the caller, which reports it. The body is ``policy/v1``
(Kubernetes 1.22+); a server that knows only ``policy/v1beta1`` (1.20, 1.21) refuses that version
with 400 or 404, and the request is sent again in the older version.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpupool.nodeagent.risk.responder import Evict

EVICTION_VERSIONS = ("policy/v1", "policy/v1beta1")
_OLDER_VERSION_REFUSALS = (400, 404)


def eviction_body(namespace: str, pod: str, api_version: str) -> dict[str, Any]:
    """The Eviction object for one pod."""
    return {"apiVersion": api_version, "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}


def evict_with(core_v1: Any) -> Evict:
    """An :data:`~gpupool.nodeagent.risk.responder.Evict` on the official client's ``CoreV1Api``."""
    from kubernetes.client.exceptions import ApiException

    def evict_now(namespace: str, pod: str) -> None:
        for version in EVICTION_VERSIONS:
            try:
                core_v1.create_namespaced_pod_eviction(pod, namespace, eviction_body(namespace, pod, version))
                return
            except ApiException as exc:
                if exc.status not in _OLDER_VERSION_REFUSALS or version == EVICTION_VERSIONS[-1]:
                    raise

    async def evict(namespace: str, pod: str) -> None:
        await asyncio.to_thread(evict_now, namespace, pod)

    return evict


def kube_evictor(node: str, kubeconfig: str | None) -> Evict:
    """The evictor on its own client, configured as the agent's pod source is."""
    from kubernetes import client

    from gpupool.kube.client_config import api_configuration

    api_client = client.ApiClient(api_configuration(kubeconfig))
    api_client.user_agent = f"gpupool-node-agent/{node}"
    return evict_with(client.CoreV1Api(api_client))
