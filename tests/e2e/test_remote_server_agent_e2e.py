"""A GPU node's agent serving remote shares against a real apiserver: it watches the pods of every
namespace, writes its GPU server's clients file for the pods whose remote-share-v1 names its node,
hands each its token in a Secret owned by the pod, runs the server, and drops a pod that is deleted
(gpupool/nodeagent/remote_setup.py; the server is a stand-in that records its command line)."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.api.annotations import CardRef
from gpupool.api.names import ResourceNames
from gpupool.api.remote_gpu import decode_clients
from gpupool.api.remote_share import RemoteShare, encode_remote_share
from gpupool.nodeagent.remote_setup import RemoteGpuOptions, run_remote_gpu
from tests.e2e.e2e_support import NO_SCHEDULER, MakeNode, pod_manifest

pytestmark = pytest.mark.e2e

RECORDER = "import sys, time; open(sys.argv[-1] + '.argv', 'w').write(' '.join(sys.argv[1:])); time.sleep(600)"


async def _until(probe: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = await asyncio.to_thread(probe)
        if found:
            return found
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)


def _secret(core_v1: client.CoreV1Api, namespace: str, name: str) -> client.V1Secret | None:
    try:
        return core_v1.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_the_agent_serves_the_pods_booked_on_its_node_and_drops_a_deleted_one(
        core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, tmp_path: Path) -> None:
    gpu, cpu = make_node(name=f"e2e-gpu-{uuid.uuid4().hex[:6]}"), make_node()
    clients_file = tmp_path / "remote-gpu-clients.json"
    options = RemoteGpuOptions("127.0.0.1:9420", "10.0.0.7:9420", clients_file, (sys.executable, "-c", RECORDER))
    created = core_v1.create_namespaced_pod(namespace, pod_manifest("remote", scheduler_name=NO_SCHEDULER,
                                                                     node_name=cpu))
    share = RemoteShare(server=gpu, time=dt.datetime.now(dt.UTC), container="main", pod_uid=created.metadata.uid,
                        card=CardRef(0, f"GPU-{gpu}-0", 4096, 300))
    core_v1.patch_namespaced_pod("remote", namespace, {"metadata": {"annotations": {
        "gpupool.io/remote-share-v1": encode_remote_share(share)}}})

    def served() -> list[Any]:
        return decode_clients(clients_file.read_text()) if clients_file.exists() else []

    async def scenario() -> None:
        agent = asyncio.create_task(run_remote_gpu(gpu, ResourceNames(), options, core_v1, publish_every_s=0.5))
        try:
            [entry] = await _until(served, "the pod in the clients file")
            assert (entry.pod, entry.card_uuid, entry.memory_mib, entry.compute_percent) == (
                f"{namespace}/remote", f"GPU-{gpu}-0", 4096, 30)
            secret = await _until(lambda: _secret(core_v1, namespace, "remote-gpupool-remote"), "the token Secret")
            data = {k: base64.b64decode(v).decode() for k, v in secret.data.items()}
            assert data == {"remote_endpoint": "10.0.0.7:9420", "remote_token": entry.token}
            [owner] = secret.metadata.owner_references
            assert (owner.kind, owner.name, owner.uid) == ("Pod", "remote", created.metadata.uid)
            argv = Path(f"{clients_file}.argv")
            await _until(argv.exists, "the server started")
            assert argv.read_text() == f"remote-gpu serve --listen 127.0.0.1:9420 --clients {clients_file}"
            await asyncio.to_thread(core_v1.delete_namespaced_pod, "remote", namespace, grace_period_seconds=0)
            await _until(lambda: clients_file.exists() and json.loads(clients_file.read_text())["clients"] == [],
                         "the deleted pod gone from the clients file")
        finally:
            agent.cancel()
            with pytest.raises(asyncio.CancelledError):
                await agent

    asyncio.run(scenario())
