"""Publish the cluster settings this node agent runs with on its Node.

The extender compares them with its own and places no GPU pod on a node whose agent reads pods
differently (:mod:`gpupool.api.settings_check`); ``kubectl gpupool`` shows the same comparison.
The annotation's key is fixed (:data:`~gpupool.api.cluster_settings.AGENT_SETTINGS_ANNOTATION`), not
under the resource domain, so that a domain that differs is seen rather than hidden.

Written once at start, before kubelet has the device plugins (so before the inventory the extender
places pods by), and retried with back-off while the API refuses it: an agent whose settings are
unknown is simply not checked, as an older agent is.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gpupool.api.cluster_settings import AGENT_SETTINGS_ANNOTATION, ClusterSettings

log = logging.getLogger(__name__)

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 30.0


def settings_patch(settings: ClusterSettings) -> dict[str, Any]:
    """The merge patch that publishes ``settings`` on a Node."""
    return {"metadata": {"annotations": {AGENT_SETTINGS_ANNOTATION: settings.published()}}}


async def publish_settings(core_v1: Any, node: str, settings: ClusterSettings, *,
                           first_retry_s: float = FIRST_RETRY_S) -> None:
    """Patch the node until it succeeds (back-off doubling up to :data:`MAX_RETRY_S`)."""
    delay = first_retry_s
    while True:
        try:
            await asyncio.to_thread(core_v1.patch_node, node, settings_patch(settings))
            log.info("published this agent's cluster settings on node %s (%s)", node, AGENT_SETTINGS_ANNOTATION)
            return
        except Exception as exc:  # the API may be away for a while: keep trying
            log.warning("publishing cluster settings on node %s failed (%s); retrying in %.0f s", node,
                        getattr(exc, "reason", None) or exc, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_RETRY_S)


def kube_core_v1(node: str, kubeconfig: str | None) -> Any:
    """A CoreV1Api configured as the agent's other clients are."""
    from kubernetes import client

    from gpupool.kube.client_config import api_configuration

    api_client = client.ApiClient(api_configuration(kubeconfig))
    api_client.user_agent = f"gpupool-node-agent/{node}"
    return client.CoreV1Api(api_client)
