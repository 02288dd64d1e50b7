"""Leave what this agent started with on its Node, in one patch: its cluster settings and its start-up checks.

- The cluster settings (:data:`~gpupool.api.cluster_settings.AGENT_SETTINGS_ANNOTATION`): the extender
  compares them with its own and places no GPU pod on a node whose agent reads pods differently
  (:mod:`gpupool.api.settings_check`); ``kubectl gpupool`` shows the same comparison. The key is
  fixed, not under the resource domain, so that a domain that differs is seen rather than hidden.
- The start-up checks' summary (:data:`~gpupool.api.cluster_settings.AGENT_CHECKS_ANNOTATION`): the log says
  it first, but an admin running ``kubectl describe node`` should not have to find the agent's pod to
  learn that it runs with, say, whole cards only or no refusal at open.

Both are known at start, before kubelet has the device plugins (so before the inventory the extender
places pods by), and go in one merge patch: one write per start, not one per concern. The patch is
retried with back-off while the API refuses it; an agent whose settings are unknown is simply not
checked, as an older agent is, and the agent serves regardless.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 30.0


def annotations_patch(annotations: Mapping[str, str]) -> dict[str, Any]:
    """The merge patch that sets ``annotations`` on a Node (others are left as they are)."""
    return {"metadata": {"annotations": dict(annotations)}}


async def publish_annotations(core_v1: Any, node: str, annotations: Mapping[str, str], *,
                              first_retry_s: float = FIRST_RETRY_S) -> None:
    """Patch the node until it succeeds (back-off doubling up to :data:`MAX_RETRY_S`)."""
    keys = ", ".join(sorted(annotations))
    delay = first_retry_s
    while True:
        try:
            await asyncio.to_thread(core_v1.patch_node, node, annotations_patch(annotations))
            log.info("wrote what this agent started with on node %s (%s)", node, keys)
            return
        except Exception as exc:  # the API may be away for a while: keep trying
            log.warning("writing %s on node %s failed (%s); retrying in %.0f s", keys, node,
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
