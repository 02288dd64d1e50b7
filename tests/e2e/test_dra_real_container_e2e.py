"""A DRA claim in a real container: kube-scheduler's DRA allocator + a real kubelet with containerd 2
(CDI on, reading the node's CDI directory) + ``gpupool node-agent --dra`` on stand-in cards.

The agent prepares the claim and writes its CDI spec; containerd applies it, so the container's
process sees the grant an Allocate would give (the env contract: 4096 MiB on the allocated card)
and the card's device node. This is what the fake runtime of test_dra_e2e.py cannot show.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.environment import ContainerEnvironment
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.dra_support import DRIVER, claim_manifest, claim_pod, containerd_dra_args, dra_installed, node_slice
from tests.e2e.e2e_support import env_from_log, wait_for
from tests.e2e.real_containers import stand_in_cards

pytestmark = pytest.mark.e2e

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)



def command(dev: Path) -> tuple[str, ...]:
    """Print the env, then which card device nodes (under the stand-ins' directory, the path the
    grant names) and whether the control device the container has, then wait."""
    return ("sh", "-c", f"env; echo DEVICES $(ls {dev} 2>/dev/null | tr '\\n' ' ') "
                        "CTL $(test -c /dev/nvidiactl && echo yes); sleep 3600")


def test_a_claims_grant_reaches_the_container_through_cdi(
        containerd_kubelet: Kubelet, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
        namespace: str, start_node_agent: Any, tmp_path: Path) -> None:
    kubelet = containerd_kubelet
    node = kubelet.node_name
    gpus = stand_in_cards(tmp_path / "dev", memory_mib=16384)
    agent = start_node_agent(kubelet, gpus, extra_args=containerd_dra_args(kubelet))
    with dra_installed(kube_api_client, node) as resource:
        wait_for(lambda: node_slice(kube_api_client, node), timeout=60, what="the agent's ResourceSlice")
        resource.create_namespaced_resource_claim(namespace, claim_manifest("claim", "4Gi"))
        core_v1.create_namespaced_pod(namespace, claim_pod("pod", "claim", node, kubelet.images.busybox.ref,
                                                           command(tmp_path / "dev")))

        def logged() -> str | None:
            pod = core_v1.read_namespaced_pod("pod", namespace)
            if pod.status.phase != "Running":
                return None
            log = str(core_v1.read_namespaced_pod_log("pod", namespace, container="main"))
            return log if "DEVICES" in log else None

        log = wait_for(logged, timeout=120, what=f"the pod's env in its log ({agent.log_path})")
        claim = kube_api_client.sanitize_for_serialization(resource.read_namespaced_resource_claim("claim", namespace))
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["driver"] == DRIVER
        card = int(result["device"].removeprefix("gpu-"))
        grant = ContainerEnvironment.from_env(env_from_log(log))
        assert [(c.index, c.uuid, c.memory_mib) for c in grant.cards] == [(card, f"GPU-real-{card:04d}", 4096)]
        assert (grant.pod, grant.container) == (f"{namespace}/pod", "claim")
        assert f"DEVICES nvidia{card} CTL yes" in log, log


def test_each_container_of_a_two_request_claim_gets_the_claims_grant(
        containerd_kubelet: Kubelet, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
        namespace: str, start_node_agent: Any, tmp_path: Path) -> None:
    """A claim of two requests (4 GiB as ``a``, 2 GiB as ``b``) and three containers: one references
    ``a``, one ``b``, one both. Each gets the claim's one grant (both shares); the third gets its CDI
    device once per request from kubelet, and the runtime starts it."""
    kubelet = containerd_kubelet
    node = kubelet.node_name
    gpus = stand_in_cards(tmp_path / "dev", memory_mib=16384)
    agent = start_node_agent(kubelet, gpus, extra_args=containerd_dra_args(kubelet))
    claim = claim_manifest("two", "4Gi")
    (first,) = claim["spec"]["devices"]["requests"]
    second = json.loads(json.dumps(first))
    first["name"], second["name"] = "a", "b"
    second["exactly"]["capacity"]["requests"]["memory"] = "2Gi"
    claim["spec"]["devices"]["requests"] = [first, second]
    manifest = claim_pod("pod", "two", node, kubelet.images.busybox.ref, command(tmp_path / "dev"))
    (template,) = manifest["spec"]["containers"]
    containers = {"main": [{"name": "gpu", "request": "a"}], "only-b": [{"name": "gpu", "request": "b"}],
                  "both": [{"name": "gpu", "request": "a"}, {"name": "gpu", "request": "b"}]}
    manifest["spec"]["containers"] = [template | {"name": name, "resources": {"claims": refs}}
                                      for name, refs in containers.items()]
    with dra_installed(kube_api_client, node) as resource:
        wait_for(lambda: node_slice(kube_api_client, node), timeout=60, what="the agent's ResourceSlice")
        resource.create_namespaced_resource_claim(namespace, claim)
        core_v1.create_namespaced_pod(namespace, manifest)

        def logs() -> dict[str, str] | None:
            pod = core_v1.read_namespaced_pod("pod", namespace)
            assert pod.status.phase not in ("Failed", "Succeeded"), pod.status.container_statuses
            if pod.status.phase != "Running":
                return None
            out = {name: str(core_v1.read_namespaced_pod_log("pod", namespace, container=name)) for name in containers}
            return out if all("DEVICES" in log for log in out.values()) else None

        got = wait_for(logs, timeout=120, what=f"each container's env in its log ({agent.log_path})")
        read = resource.read_namespaced_resource_claim("two", namespace)
        allocated = kube_api_client.sanitize_for_serialization(read)
        results = allocated["status"]["allocation"]["devices"]["results"]
    shares = sorted((r["request"], int(r["device"].removeprefix("gpu-"))) for r in results)
    assert [request for request, _ in shares] == ["a", "b"]
    wanted = sorted({card for _, card in shares})
    for name, log in got.items():
        grant = ContainerEnvironment.from_env(env_from_log(log))
        assert grant.container == "two", (name, log)
        assert sorted({c.index for c in grant.cards}) == wanted, (name, log)
        assert sum(c.memory_mib for c in grant.cards) == 6144, (name, log)
