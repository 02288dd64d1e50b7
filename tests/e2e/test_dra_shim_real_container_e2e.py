"""A DRA claim enforced in a real container: the interception library holds the claim's process to
its share, as it holds an extended-resource pod's (enforcement is on by default, so a DRA user gets it).

As ``test_dra_real_container_e2e.py`` (kube-scheduler's DRA allocator, a real kubelet with containerd
2 applying the agent's CDI spec) with ``gpupool node-agent --dra --isolation shim``: the claim's CDI
device carries what an Allocate would give under the library (its mounts, the preload, the grant),
keyed by the pod's UID and the claim's name. The image holds the stand-in driver and the library
tests' probe; the pod's manifest names no library. A 4 GiB claim on a 16 GiB card: the probe gets
its 4 GiB and is refused one more MiB, and a second process sees a 4 GiB card.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.dra_support import claim_manifest, claim_pod, containerd_dra_args, dra_installed, node_slice
from tests.e2e.e2e_support import wait_for
from tests.e2e.probe_image import PROBE, STANDIN_STATE, probe_image
from tests.e2e.real_containers import stand_in_cards
from tests.shim.toolchain import parse_steps

pytestmark = pytest.mark.e2e

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

OK, OUT_OF_MEMORY = 0, 2  # CUresult
COMMAND = f"{PROBE} procaddress alloc:4g alloc:1m; {PROBE} symbol total; echo DONE; sleep 3600"


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gdr", dir="/tmp"))  # short: the agent's socket lives below it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_claims_share_is_enforced_by_the_interception_library_in_a_real_container(
        containerd_kubelet: Kubelet, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
        namespace: str, start_node_agent: Any, tmp_path: Path, state_dir: Path) -> None:
    kubelet = containerd_kubelet
    tc, image_ref = probe_image("dra-shim-e2e", kubelet, tmp_path)
    node = kubelet.node_name
    args = (*containerd_dra_args(kubelet), "--isolation", "shim", "--shim-library", str(tc.preload),
            "--state-dir", str(state_dir))
    agent = start_node_agent(kubelet, stand_in_cards(tmp_path / "dev", memory_mib=16384), extra_args=args)
    with dra_installed(kube_api_client, node) as resource:
        wait_for(lambda: node_slice(kube_api_client, node), timeout=60, what="the agent's ResourceSlice")
        resource.create_namespaced_resource_claim(namespace, claim_manifest("claim", "4Gi"))
        manifest: dict[str, Any] = claim_pod("pod", "claim", node, image_ref, ("sh", "-c", COMMAND))
        manifest["spec"]["containers"][0]["env"] = [{"name": "GPUPOOL_STANDIN_STATE", "value": STANDIN_STATE}]
        assert "LD_PRELOAD" not in str(manifest)
        core_v1.create_namespaced_pod(namespace, manifest)

        def finished_log() -> str | None:
            pod = core_v1.read_namespaced_pod("pod", namespace)
            assert pod.status.phase not in ("Failed", "Succeeded"), (pod.status.phase, pod.status.container_statuses)
            if pod.status.phase != "Running":
                return None
            log = str(core_v1.read_namespaced_pod_log("pod", namespace, container="main"))
            return log if "DONE" in log else None

        log = wait_for(finished_log, timeout=120, what=f"the probe's steps ({agent.log_path})")
    steps = [(s.text, s.code) for line in log.splitlines() for s in parse_steps(line)]
    assert steps[:2] == [("alloc:4g", OK), ("alloc:1m", OUT_OF_MEMORY)], log
    (total,) = [s for line in log.splitlines() for s in parse_steps(line) if s.text == "total"]
    assert total.code == OK and int(total.values[0]) == 4 << 30, log
