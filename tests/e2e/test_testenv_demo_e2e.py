"""The README's five-minute try: ``gpupool testenv up --demo`` as a user types it.

It must bring up a cluster of its own (control plane, a kubelet with the fake runtime), gpupool's
extender, gpupool's scheduler and a node agent with fake GPUs, and print a GPU pod; that pod, applied
as printed, must be placed by gpupool-scheduler and run with its share of one card; ``gpupool testenv
down`` must stop every process the demo started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from gpupool.testenv.paths import Binaries
from gpupool.testenv.procs import ManagedProcess
from tests.e2e.e2e_support import GPUPOOL_CLI, REPO, env_from_log, wait_for

pytestmark = pytest.mark.e2e


def gpupool(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUPOOL_CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture
def demo(testenv_binaries: Binaries) -> Iterator[tuple[Path, str]]:
    """``up --demo`` in a state directory of its own (short: the device plugins' sockets live under
    it); ``down`` afterwards whatever happened."""
    state = Path(tempfile.mkdtemp(prefix="gpupool-demo-", dir="/tmp"))
    try:
        up = gpupool("testenv", "up", "--demo", "--state-dir", str(state), timeout=400)
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
        yield state, up.stdout
    finally:
        gpupool("testenv", "down", "--state-dir", str(state), timeout=120)


def test_the_demo_pod_it_prints_runs_with_its_share_placed_by_gpupools_scheduler(demo: tuple[Path, str]) -> None:
    state, out = demo
    assert f"testenv env --state-dir {state}" in out and "kubectl apply -f" in out
    pod_path = Path(out.split("\n--- ", 1)[1].splitlines()[0])
    printed = yaml.safe_load(out.split(f"--- {pod_path}\n", 1)[1])
    assert printed == yaml.safe_load(pod_path.read_text())  # the pod shown is the file to apply
    recorded = json.loads((state / "state.json").read_text())
    assert sorted(p["name"] for p in recorded["processes"]) == ["gpupool-extender", "gpupool-node-agent",
                                                               "gpupool-scheduler"]

    api = config.new_client_from_config(config_file=recorded["control_plane"]["kubeconfig"])
    try:
        core_v1 = client.CoreV1Api(api)
        core_v1.create_namespaced_pod("default", printed)
        name = printed["metadata"]["name"]

        def running() -> client.V1Pod | None:
            pod = core_v1.read_namespaced_pod(name, "default")
            assert pod.status.phase != "Failed", pod.status
            return pod if pod.status.phase == "Running" else None

        pod = wait_for(running, timeout=60, what="the demo pod Running")
        assert pod.spec.node_name == "gpu-node-1"
        events = core_v1.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
        scheduled = [e for e in events if e.reason == "Scheduled"]
        assert scheduled and (scheduled[0].reporting_component or scheduled[0].source.component) == "gpupool-scheduler"
        env = wait_for(lambda: env_from_log(str(core_v1.read_namespaced_pod_log(name, "default"))) or None,
                       timeout=30, what="the container's env in its log")
        assert env["GPUPOOL_MEMORY_LIMIT_MIB"] == "4096" and env["GPUPOOL_COMPUTE_PERCENT"] == "30"
        assert env["GPUPOOL_CARD_UUIDS"] in ("GPU-demo-0000", "GPU-demo-0001")
    finally:
        api.close()

    # the README's next step: the plugin shows the booked card and its holder
    inspect = subprocess.run([sys.executable, "-m", "gpupool.kubectl", "inspect", "--kubeconfig",
                              recorded["control_plane"]["kubeconfig"]], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert inspect.returncode == 0, inspect.stderr
    assert "4096/16384" in inspect.stdout and "default/gpu-demo/main (4096MiB, 30%)" in inspect.stdout, inspect.stdout

    down = gpupool("testenv", "down", "--state-dir", str(state), timeout=120)
    assert down.returncode == 0, down.stderr
    assert not any(ManagedProcess.from_record(p).alive() for p in recorded["processes"])
