"""The node's grant as a read-only mount in a real container: a process inside cannot write, remove
or replace it, nor the region's account, and the limit it gets is the grant's whatever it sets.

As ``test_shim_real_container_e2e.py``: kube-scheduler with ``gpupool extender``, a real kubelet with
containerd and runc, ``gpupool node-agent --isolation shim`` serving Allocate, the stand-in driver
and the library tests' probe in the image. The container runs as root (the runtime's default) and
tries, with busybox's tools, to append to, truncate, remove, rename, replace and chmod
``/etc/gpupool/grant``, to add a file beside it, to write the token and the read-only view of the
region, to remove, rename or rename over the read-write region mount, and to unmount or cover
``/etc/gpupool``. Each must fail, with ``EROFS`` (a read-only mount), ``EBUSY`` (a mount point) or
``EPERM`` (no ``CAP_SYS_ADMIN``); afterwards the host's grant file is unchanged and the region
still the agent's. Then the probe, with ``GPUPOOL_MEMORY_LIMIT_MIB=16384``,
``CUDA_DEVICE_MEMORY_LIMIT=16g`` and ``GPUPOOL_SHIM_DISABLE=1``, and again with an empty
environment, sees a 4 GiB card and is refused past 4 GiB: the grant's limit, not the environment's.

Last, the heartbeat (issue 26): the container's first process becomes the probe, which registers
and holds; with ``--registration-heartbeat 1`` its container's
``gpupool_container_heartbeat_age_seconds`` stays under 3 s while it runs, turns stale (over 3 s)
once the host stops it with ``SIGSTOP`` (the library's renewal thread stops with it), and fresh
again after ``SIGCONT``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.names import ResourceNames
from gpupool.api.shim_contract import decode_grant
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.e2e_support import ExtenderProcess, NodeAgentProcess, wait_for
from tests.e2e.probe_image import PROBE, STANDIN_STATE, probe_image, shim_agent
from tests.e2e.test_shim_real_container_e2e import runs

pytestmark = pytest.mark.e2e

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

NAMES = ResourceNames()
GIB = 1 << 30
CARD_MIB = 16384
SHARE_UNITS = "16"  # gpu-mem units of 256 MiB: 4 GiB
SHARE_BYTES = 4 * GIB
OK, OUT_OF_MEMORY = 0, 2  # CUresult
ERR = "/var/run/gpupool/err"

#: name → shell command; each must fail.
ATTEMPTS = {
    "grant-append": "echo memory_mib=16384 >> /etc/gpupool/grant",
    "grant-truncate": ": > /etc/gpupool/grant",
    "grant-remove": "rm /etc/gpupool/grant",
    "grant-rename": "mv /etc/gpupool/grant /etc/gpupool/grant.old",
    "grant-replace": "echo memory_mib=16384 > /var/run/gpupool/forged && mv /var/run/gpupool/forged /etc/gpupool/grant",
    "grant-chmod": "chmod 666 /etc/gpupool/grant",
    "grant-dir-new-file": "echo version=1 > /etc/gpupool/grant.d",
    "token-write": "echo 00 > /etc/gpupool/token",
    "region-readonly-view-write": "echo x >> /etc/gpupool/memory.region",
    "region-remove": "rm /var/run/gpupool/memory.region",
    "region-rename": "mv /var/run/gpupool/memory.region /var/run/gpupool/old.region",
    "region-replace": "echo > /var/run/gpupool/new.region && mv /var/run/gpupool/new.region "
                      "/var/run/gpupool/memory.region",
    "grant-unmount": "umount /etc/gpupool",
    "grant-cover": "mount -t tmpfs none /etc/gpupool",
}
#: What the kernel answers, as busybox prints it (EROFS, EBUSY, EPERM; busybox's mount words EPERM its own way).
REFUSALS = ("read-only file system", "resource busy", "operation not permitted", "permission denied")
RAISED = "GPUPOOL_MEMORY_LIMIT_MIB=16384 CUDA_DEVICE_MEMORY_LIMIT=16g GPUPOOL_SHIM_DISABLE=1"
REGISTERED = re.compile(r"registered pid (\d+) \(pid 1 in its container\)")
TRIED = re.compile(r"^try (\S+) (done|refused): ?(.*)$", re.MULTILINE)


def command() -> str:
    tries = "; ".join(f"t {name} '{shell}'" for name, shell in ATTEMPTS.items())
    return (f't() {{ if sh -c "$2" 2>{ERR}; then echo "try $1 done"; else echo "try $1 refused: $(cat {ERR})"; fi; }}; '
            f"{tries}; "
            f"echo run raised; env {RAISED} {PROBE} symbol total alloc:4g alloc:1m; "
            f"echo run empty; env -i GPUPOOL_STANDIN_STATE={STANDIN_STATE} {PROBE} symbol total alloc:4g alloc:1m; "
            f"echo all-done; echo run hold; exec {PROBE} symbol hold")


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gsm", dir="/tmp"))  # short: the agent's socket lives below it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pod_manifest(node: str, image: str) -> dict[str, Any]:
    container = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["sh", "-c", command()],
                 "env": [{"name": "GPUPOOL_STANDIN_STATE", "value": STANDIN_STATE}],
                 "resources": {"limits": {NAMES.gpu_mem: SHARE_UNITS}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "grant"},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 1,
                     "nodeSelector": {"kubernetes.io/hostname": node}}}


def test_a_container_cannot_write_remove_or_replace_its_grant_nor_lift_its_limit(
    core_v1: client.CoreV1Api, namespace: str, containerd_kubelet: Kubelet, tmp_path: Path, state_dir: Path,
    start_node_agent: Callable[..., NodeAgentProcess], gpupool_extender: ExtenderProcess,
) -> None:
    kubelet = containerd_kubelet
    tc, image_ref = probe_image("shim-grant-e2e", kubelet, tmp_path)
    node = kubelet.node_name
    agent = shim_agent(start_node_agent, kubelet, core_v1, tc, tmp_path / "dev", state_dir,
                       "--registration-heartbeat", "1", card_mib=CARD_MIB)
    created = time.monotonic()
    core_v1.create_namespaced_pod(namespace, pod_manifest(node, image_ref))

    def finished_log() -> str | None:
        pod = core_v1.read_namespaced_pod("grant", namespace)
        assert pod.status.phase not in ("Failed", "Succeeded"), (pod.status.phase, pod.status.container_statuses)
        if pod.status.phase != "Running":
            return None
        log = str(core_v1.read_namespaced_pod_log("grant", namespace, container="main"))
        return log if "hold 0" in log else None

    log = wait_for(finished_log, timeout=90, what=f"the container's attempts\n{agent.log()}")
    print(f"\n  pod create to the last attempt: {time.monotonic() - created:.1f} s")
    tried = {name: (outcome, why) for name, outcome, why in TRIED.findall(log)}
    assert set(tried) == set(ATTEMPTS), log
    for name, (outcome, why) in sorted(tried.items()):
        print(f"  {name}: {outcome}: {why}")
        assert outcome == "refused" and any(r in why.lower() for r in REFUSALS), f"{name}: {outcome} {why}\n{log}"

    steps = runs(log)
    for run in ("raised", "empty"):
        assert [(s.text, s.code) for s in steps[run]] == [
            ("total", OK), ("alloc:4g", OK), ("alloc:1m", OUT_OF_MEMORY)], log
        assert int(steps[run][0].values[0]) == SHARE_BYTES, log

    [directory] = [d for d in (state_dir / "containers").iterdir() if d.name.endswith("_main")]
    grant = decode_grant((directory / "grant").read_text())
    assert grant.memory_mib == (SHARE_BYTES >> 20,) and grant.container == "main"  # the host's copy is unchanged
    assert (directory / "memory.region").stat().st_size > 0

    host_pid = int(wait_for(lambda: REGISTERED.findall(agent.log()) or None, timeout=30,
                            what=f"the holding probe's registration\n{agent.log()}")[-1])
    beats = []
    for _ in range(4):
        time.sleep(1)
        beats.append(heartbeat(agent))
    assert all(beat is not None and beat[0] < 3 and not beat[1] for beat in beats), beats

    def stale_now() -> tuple[float, bool] | None:
        beat = heartbeat(agent)
        return beat if beat is not None and beat[1] else None

    def fresh_now() -> tuple[float, bool] | None:
        beat = heartbeat(agent)
        return beat if beat is not None and not beat[1] else None

    os.kill(host_pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        stale = wait_for(stale_now, timeout=15, what="the stopped probe's heartbeat going stale")
        print(f"  SIGSTOP to stale: {time.monotonic() - stopped:.1f} s (age {stale[0]:.1f} s)")
    finally:
        os.kill(host_pid, signal.SIGCONT)
    resumed = time.monotonic()
    wait_for(fresh_now, timeout=10, what="the resumed probe renewing again")
    print(f"  SIGCONT to fresh: {time.monotonic() - resumed:.1f} s")


def heartbeat(agent: NodeAgentProcess) -> tuple[float, bool] | None:
    """The pod's heartbeat age and stale flag on the agent's /metrics."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(agent.metrics()):
        for sample in family.samples:
            if sample.labels.get("pod") == "grant" and sample.name.startswith("gpupool_container_heartbeat_"):
                found[sample.name] = sample.value
    if len(found) < 2:
        return None
    return found["gpupool_container_heartbeat_age_seconds"], found["gpupool_container_heartbeat_stale"] == 1.0
