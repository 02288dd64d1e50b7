"""A pod made the way a Deployment makes them (``generateName``, no name) computes on a remote share
with nothing remote-specific in its spec but the request: the pod-scheduler webhook injects the GPU
client and the grant (gpupool/extender/remote_injection.py), the GPU node's agent hands the grant
over, the pod's node runs it in real containers.

What runs:

* ``gpupool extender --admission-port ... --remote-client-image IMAGE`` behind the shipped
  pod-scheduler webhook (components/scheduler-webhook/webhook.yaml, only its clientConfig pointed at
  the extender and its namespaceSelector narrowed to this test's namespace);
* a real kubelet with containerd (the pod's node: no GPU, no gpupool agent), and a Node object with
  one card (the GPU node);
* the GPU node's agent side (:func:`gpupool.nodeagent.remote_setup.run_remote_gpu`): its clients
  file, the token Secret ``<pod>-gpupool-remote``, and ``gpupool remote-gpu serve`` on the
  stand-in driver (card ``GPU-standin-0``) on loopback.

The pod's image holds the driver API program (bench/remote_probe.c) and no ``libcuda.so.1`` at all:
the program starts only because the injected ``LD_PRELOAD`` names the client the init container
copied (and gpupool's CUDA runtime beside it, which this driver API program loads but never calls).
The pod uses the host's network to reach the server on loopback (``hostNetwork``: test plumbing, the
server's address is 127.0.0.1). The bind is the extender's binder called by the test (the webhook
sends the pod to gpupool's scheduler, which this test does not run:
tests/e2e/test_remote_gpu_whole_path_e2e.py runs it, the extender and the agent as programs). The
init container's image holds, instead of gpupool and Python, a shell stand-in for
``gpupool remote-gpu install-client`` (copy the client and the runtime when ``GPUPOOL_REMOTE_SHARE``
is set, wait for the token), which tests/remote/test_install_client.py tests as shipped
(tests/e2e/remote_e2e_support.py builds both images).
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.remote_share import decode_remote_share
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.remote_injection import INIT_CONTAINER
from gpupool.extender.scheduler_steering import GPUPOOL_SCHEDULER
from gpupool.kube.podapi import KubePodApi
from gpupool.nodeagent.remote_setup import RemoteGpuOptions, run_remote_gpu
from gpupool.shim.build import build_standin
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.e2e_support import MakeNode, free_port, log_tail, wait_for
from tests.e2e.remote_e2e_support import (
    CARD,
    INSTALLED,
    NAMES,
    PROBE,
    PROBE_RESULT,
    WebhookExtender,
    app_image,
    injected,
    listening,
    stand_in_server,
    webhook_extender,
)

pytestmark = pytest.mark.e2e

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)


def app_pod(image: str) -> dict[str, Any]:
    """What a Deployment's ReplicaSet sends: no name, and nothing of the remote GPU but the
    annotation and the request."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "trainer-5f7c9-", "annotations": {NAMES.remote_gpu: "true"}},
            "spec": {"restartPolicy": "Never", "hostNetwork": True, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                     "command": [PROBE, "vector_add", "100000"],
                                     "env": [{"name": "GPUPOOL_REMOTE_DEADLINE_MS", "value": "20000"}],
                                     "resources": {"limits": {NAMES.gpu_mem: "16"}}}]}}


class AgentThread:
    """:func:`run_remote_gpu` on its own event loop, cancelled by :meth:`stop`."""

    def __init__(self, node: str, options: RemoteGpuOptions, core_v1: client.CoreV1Api) -> None:
        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.task = self.loop.create_task(run_remote_gpu(node, NAMES, options, core_v1, publish_every_s=0.5))
            try:
                self.loop.run_until_complete(self.task)
            except asyncio.CancelledError:
                pass
            except BaseException as exc:  # reported by the test
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(timeout=15)


@pytest.fixture
def injecting(control_plane: ControlPlane, kube_api_client: client.ApiClient, namespace: str,
              containerd_kubelet: Kubelet, tmp_path: Path) -> Iterator[WebhookExtender]:
    """The extender serving the pod-scheduler webhook with --remote-client-image, for ``namespace``."""
    with webhook_extender(control_plane, kube_api_client, namespace, containerd_kubelet, tmp_path) as serving:
        yield serving


def test_a_generate_name_pod_computes_on_a_remote_share_with_only_the_request_in_its_spec(
        core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, containerd_kubelet: Kubelet,
        injecting: WebhookExtender, tmp_path: Path) -> None:
    extender, init_ref = injecting.extender, injecting.init_ref
    image = app_image(containerd_kubelet, tmp_path)  # no libcuda.so.1 in it
    gpu = make_node(name=f"e2e-gpu-{uuid.uuid4().hex[:6]}",
                    annotations={NAMES.inventory: encode_inventory(Inventory((CARD,)))})
    cpu = containerd_kubelet.node_name

    body = app_pod(image)
    # the apiserver's webhook informer takes a moment: dry-run until the webhook injects
    wait_for(lambda: injected(core_v1.create_namespaced_pod(namespace, body, dry_run="All")), timeout=60,
             what=f"the webhook to inject a dry-run pod\n{log_tail(extender.log_path)}")
    created: Any = core_v1.create_namespaced_pod(namespace, body)
    name = str(created.metadata.name)
    assert name.startswith("trainer-5f7c9-") and len(name) == len("trainer-5f7c9-") + 5
    assert created.spec.scheduler_name == GPUPOOL_SCHEDULER
    assert created.spec.init_containers[0].image == init_ref
    assert {v.name: v.secret.secret_name for v in created.spec.volumes if v.secret} == {
        "gpupool-remote-grant": f"{name}-gpupool-remote"}

    port = free_port()
    options = RemoteGpuOptions(f"127.0.0.1:{port}", f"127.0.0.1:{port}", tmp_path / "remote-gpu-clients.json",
                               stand_in_server(build_standin(), tmp_path / "standin.state"))
    agent = AgentThread(gpu, options, core_v1)
    try:
        # the GPU node's server is up before the pod is bound (as on a node whose agent runs already)
        wait_for(lambda: listening(port), timeout=120, what="the GPU node's server to listen")
        cache = ClusterCache(policy="binpack")
        nodes = json.loads(core_v1.list_node(_preload_content=False).data)["items"]
        cache.replace_nodes([n for n in nodes if n["metadata"]["name"] in (gpu, cpu)])
        cache.replace_pods(json.loads(core_v1.list_namespaced_pod(namespace, _preload_content=False).data)["items"])
        result = Binder(cache, KubePodApi(core_v1)).bind(namespace, name, created.metadata.uid, cpu)
        assert result.ok, result.error

        def finished() -> str | None:
            status = core_v1.read_namespaced_pod(name, namespace).status
            phase = str(status.phase) if status is not None else ""
            return phase if phase in ("Succeeded", "Failed") else None

        phase = wait_for(finished, timeout=240, what=f"the injected pod {name} to finish")
        pod: Any = core_v1.read_namespaced_pod(name, namespace)
        main = str(core_v1.read_namespaced_pod_log(name, namespace, container="main"))
        init = str(core_v1.read_namespaced_pod_log(name, namespace, container=INIT_CONTAINER))
    finally:
        agent.stop()
    assert agent.error is None, agent.error
    assert (phase, main.strip()) == ("Succeeded", PROBE_RESULT), (phase, main, init)
    assert init.strip() == INSTALLED
    share = decode_remote_share(pod.metadata.annotations[NAMES.remote_share])
    assert (share.server, share.card.uuid, pod.spec.node_name) == (gpu, CARD.uuid, cpu)

