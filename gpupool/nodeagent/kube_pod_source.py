"""Pods and node metadata through the official kubernetes client (blocking calls run in threads).

Pods are read from a watch of this node's pods (:class:`gpupool.nodeagent.pod_cache.NodePodCache`),
not one GET per pod on every Allocate and every PodResources poll; :meth:`KubePodSource.run` must be
running for it to fill. A GET by name remains only as the cache's last resort. Writes are merge
patches: ``allocated-v1`` on pods, the inventory and model label on the node (and gpushare's card
count in its status where gpushare's names are served); the usage monitor's
busy/idle changes are created as events on the pods holding the card.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.enforcement import EnforcementNotice, encode_notice
from gpupool.api.names import ResourceNames
from gpupool.kube.client_config import api_configuration
from gpupool.kube.podapi import pod_event
from gpupool.nodeagent.foreign_capacity import capacity_patch
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.pod_cache import NodePodCache
from gpupool.nodeagent.types import PodView

#: The agent's requests say who made them (apiserver logs, audit, API priority and fairness).
USER_AGENT = "gpupool-node-agent"


class KubePodSource:
    """:class:`PodSource` over the API server for the pods of ``node``."""

    def __init__(self, names: ResourceNames, node: str, kubeconfig: str | None = None) -> None:
        import kubernetes

        k8s = cast(Any, kubernetes)  # the client ships without type information
        client = k8s.client
        api_client = client.ApiClient(api_configuration(kubeconfig))
        api_client.user_agent = f"{USER_AGENT}/{node}"
        self.names = names
        self._api = client.CoreV1Api(api_client)
        self._sanitize = api_client.sanitize_for_serialization
        self.cache = NodePodCache(node, names, self._api.list_pod_for_all_namespaces, self.read)

    async def run(self) -> None:
        """Keep the pod cache current (list+watch) until cancelled."""
        await self.cache.run()

    async def get(self, namespace: str, name: str) -> PodView | None:
        """The pod from the watch cache (see :meth:`NodePodCache.get`); ``None`` when it does not exist."""
        return await self.cache.get(namespace, name)

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """GET the pod, as JSON; ``None`` on 404 (the cache's last resort: the cache decodes it as it
        decodes a watch event, and hands it to the same readers)."""
        import kubernetes

        api_exception = cast(Any, kubernetes).client.exceptions.ApiException
        try:
            pod = await asyncio.to_thread(self._api.read_namespaced_pod, name, namespace)
        except api_exception as exc:
            if exc.status == 404:
                return None
            raise
        raw: dict[str, Any] = self._sanitize(pod)
        return raw

    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch the pod's annotations."""
        body = {"metadata": {"annotations": dict(annotations)}}
        await asyncio.to_thread(self._api.patch_namespaced_pod, name, namespace, body)

    async def post_event(self, namespace: str, name: str, reason: str, message: str,
                         event_type: str = "Normal") -> None:
        """Create an event about the pod (the usage monitor's busy/idle changes; a refused grant's
        Warning)."""
        body = pod_event(namespace, name, "", reason, message)
        body["type"] = event_type
        body["source"] = {"component": USER_AGENT, "host": self.cache.node}
        await asyncio.to_thread(self._api.create_namespaced_event, namespace, body)

    async def publish_node(self, node: str, inventory: GpuInventory, notice: EnforcementNotice | None = None,
                           capacity: Mapping[str, str] | None = None) -> None:
        """Write the inventory and enforcement annotations and the GPU model label on the node, and
        ``capacity`` into its status (:mod:`gpupool.nodeagent.foreign_capacity`)."""
        await asyncio.to_thread(self._api.patch_node, node, node_patch(self.names, inventory, notice))
        if capacity:
            await asyncio.to_thread(self._api.patch_node_status, node, capacity_patch(dict(capacity)))


def node_patch(names: ResourceNames, inventory: GpuInventory,
               notice: EnforcementNotice | None = None) -> dict[str, Any]:
    """The merge patch that publishes a node's cards: ``inventory-v1`` (the extender's own schema,
    so its reader accepts what the node writes), ``enforcement-v1`` (whether it takes shares and who
    enforces them) and the GPU model label."""
    annotations = {names.inventory: encode_inventory(Inventory(inventory.cards, inventory.topology))}
    if notice is not None:
        annotations[names.enforcement] = encode_notice(notice)
    return {"metadata": {"annotations": annotations,
                         "labels": {names.model_label: _label_value(inventory.model)}}}


def _label_value(text: str) -> str:
    """Label values allow [A-Za-z0-9._-], at most 63 characters."""
    cleaned = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in text)
    return cleaned[:63].strip("-._") or "unknown"
