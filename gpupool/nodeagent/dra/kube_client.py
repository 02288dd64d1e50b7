"""ResourceClaims and ResourceSlices through the official kubernetes client (resource.k8s.io/v1).

Objects are read as the API's JSON (``_preload_content=False``), not the client's models, so a
field newer than the client (consumable capacity's ``consumedCapacity``, ``shareID``) is never
dropped on the way. Blocking calls run in threads.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, cast

from gpupool.kube.client_config import api_configuration

USER_AGENT = "gpupool-node-agent"


class KubeDraClient:
    """The two API calls the DRA driver makes: read a claim, keep this node's slice."""

    def __init__(self, node: str, kubeconfig: str | None = None) -> None:
        import kubernetes

        k8s = cast(Any, kubernetes)  # the client ships without type information
        api_client = k8s.client.ApiClient(api_configuration(kubeconfig))
        api_client.user_agent = f"{USER_AGENT}/{node}"
        self._api = k8s.client.ResourceV1Api(api_client)
        self._not_found = k8s.client.exceptions.ApiException

    async def read_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The claim's JSON; ``None`` when it does not exist."""
        try:
            response = await asyncio.to_thread(self._api.read_namespaced_resource_claim, name, namespace,
                                               _preload_content=False)
        except self._not_found as exc:
            if exc.status == 404:
                return None
            raise
        return cast(Mapping[str, Any], json.loads(response.data))

    async def read_slice(self, name: str) -> Mapping[str, Any] | None:
        """The slice's JSON; ``None`` when it does not exist."""
        try:
            response = await asyncio.to_thread(self._api.read_resource_slice, name, _preload_content=False)
        except self._not_found as exc:
            if exc.status == 404:
                return None
            raise
        return cast(Mapping[str, Any], json.loads(response.data))

    async def write_slice(self, body: Mapping[str, Any], resource_version: str | None) -> None:
        """Create the slice (``resource_version`` ``None``) or replace it at that version."""
        if resource_version is None:
            await asyncio.to_thread(self._api.create_resource_slice, dict(body))
            return
        replaced = {**body, "metadata": {**body["metadata"], "resourceVersion": resource_version}}
        await asyncio.to_thread(self._api.replace_resource_slice, body["metadata"]["name"], replaced)
