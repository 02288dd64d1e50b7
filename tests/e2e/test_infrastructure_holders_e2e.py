"""Infrastructure holders with a real kubelet, containerd and runc (issues 26/27).

A host process whose executable is named ``nvidia-persistenced`` (a copy of ``sleep``) holds both
stand-in cards, as the real daemon holds every GPU; a pod's container runs a program of the same
name (built into the test image) that opens its granted card. The agent's state file marks the host
process as infrastructure on both cards and leaves the card only it holds free; the container's
process is its container's holder, unmarked, and its card is busy: a tenant cannot claim to be the
host's daemon by its binary's name, and its pod booked a share, so the agent's listing its namespace
in ``--infrastructure-namespaces`` (issue 26) does not exempt it either. A second pod there that booked
no GPU (a DaemonSet's, as the GPU Operator's DCGM exporter: the card reached through a hostPath)
holds the other card: marked with its namespace, and that card stays free. After the agent restarts,
both pods' holders, restored from its state file, are undecided until its pod watch has listed, then
judged the same way again (the start-up window of ``--infrastructure-namespaces``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.annotations import decode_assignment
from gpupool.testenv.images import build_image
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.e2e_support import ExtenderProcess, NodeAgentProcess, wait_for
from tests.e2e.real_containers import stand_in_cards
from tests.e2e.test_usage_monitor_real_containers_e2e import CARD_MIB, NAMES, pod_manifest, running

pytestmark = pytest.mark.e2e

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

OPENER_C = r"""
#include <fcntl.h>
#include <unistd.h>
int main(int argc, char **argv) { if (argc < 2 || open(argv[1], O_RDONLY) < 0) return 1; pause(); return 0; }
"""


def state(agent: NodeAgentProcess) -> dict[str, dict[str, Any]]:
    """Device path → its entry in the agent's state file."""
    if not agent.usage_state.exists():
        return {}
    return {d["path"]: d for d in json.loads(agent.usage_state.read_text())["devices"]}


@pytest.fixture
def host_daemon(tmp_path: Path) -> Iterator[Callable[[list[str]], int]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(paths: list[str]) -> int:
        sleep = shutil.which("sleep")
        assert sleep is not None
        daemon = tmp_path / "host-bin" / "nvidia-persistenced"
        daemon.parent.mkdir()
        shutil.copy(os.path.realpath(sleep), daemon)
        opens = " ".join(f'{3 + i}<"{p}"' for i, p in enumerate(paths))
        child = subprocess.Popen(["bash", "-c", f'exec {opens}; exec "{daemon}" 600'])
        started.append(child)
        wait_for(lambda: os.readlink(f"/proc/{child.pid}/exe") == str(daemon), timeout=10, what="the daemon's exec")
        return child.pid

    yield start
    for child in started:
        child.kill()
        child.wait()


def test_a_host_daemon_is_infrastructure_and_a_container_of_the_same_name_is_not(
    core_v1: client.CoreV1Api, namespace: str, containerd_kubelet: Kubelet, tmp_path: Path,
    start_node_agent: Callable[..., NodeAgentProcess], gpupool_extender: ExtenderProcess,
    host_daemon: Callable[[list[str]], int],
) -> None:
    kubelet = containerd_kubelet
    node = kubelet.node_name
    gcc = shutil.which("gcc")
    assert gcc is not None  # installed with the runtime tools
    (tmp_path / "opener.c").write_text(OPENER_C)
    subprocess.run([gcc, "-O2", "-o", tmp_path / "opener", tmp_path / "opener.c"], check=True)
    image = build_image("named-like-persistenced", {"/usr/local/bin/nvidia-persistenced": tmp_path / "opener"})
    kubelet.import_image(image)

    prefix = f"{tmp_path / 'dev'}/nvidia"
    agent = start_node_agent(kubelet, stand_in_cards(tmp_path / "dev"), ("--infrastructure-namespaces", namespace))
    wait_for(lambda: (core_v1.read_node(node).status.allocatable or {}).get(NAMES.gpu_mem) == str(2 * CARD_MIB // 256),
             timeout=60, what=f"gpupool devices on {node}\n{agent.log()}")
    cards = [f"{prefix}{i}" for i in range(2)]
    daemon = host_daemon(cards)

    def daemon_marked() -> bool:
        seen = state(agent)
        return all([(h["pid"], h.get("infrastructure")) for h in seen.get(p, {}).get("holders", [])
                    if h["pid"] == daemon] == [(daemon, "nvidia-persistenced")] for p in cards)

    wait_for(daemon_marked, timeout=30, what=f"the host daemon marked on both cards\n{agent.log()}")
    assert [state(agent)[p]["state"] for p in cards] == ["free", "free"]

    limits = {NAMES.gpu_mem: "16", NAMES.gpu_core: "30"}
    core_v1.create_namespaced_pod(namespace, pod_manifest(
        "job", node, image.ref, {"main": limits}, 'exec nvidia-persistenced "${CARD_PREFIX}${GPUPOOL_CARD_INDICES}"',
        {"CARD_PREFIX": prefix}))
    pod = wait_for(lambda: running(core_v1, namespace, "job"), timeout=90, what=f"job Running\n{agent.log()}")
    [assigned] = decode_assignment(pod.metadata.annotations[NAMES.assignment]).containers
    [card] = assigned.cards
    mine, other = f"{prefix}{card.index}", cards[1 - card.index]

    def container_holder() -> dict[str, Any] | None:
        named = [h for h in state(agent).get(mine, {}).get("holders", []) if h["container"] == "main"]
        return named[0] if named else None

    found = wait_for(container_holder, timeout=30, what=f"the container's open of {mine}, named\n{agent.log()}")
    assert os.path.basename(os.readlink(f"/proc/{found['pid']}/exe")) == "nvidia-persistenced"
    assert (found["namespace"], found["pod"], found.get("infrastructure")) == (namespace, "job", "")
    assert state(agent)[mine]["state"] == "busy"
    assert state(agent)[other]["state"] == "free"  # still only the host daemon there

    exporter = pod_manifest("exporter", node, image.ref, {"main": {}}, f'exec nvidia-persistenced "{other}"', {})
    exporter["spec"]["volumes"] = [{"name": "dev", "hostPath": {"path": str(tmp_path / "dev"), "type": "Directory"}}]
    exporter["spec"]["containers"][0]["volumeMounts"] = [{"name": "dev", "mountPath": str(tmp_path / "dev")}]
    core_v1.create_namespaced_pod(namespace, exporter)
    wait_for(lambda: running(core_v1, namespace, "exporter"), timeout=90, what=f"exporter Running\n{agent.log()}")

    def exporter_holder() -> dict[str, Any] | None:
        named = [h for h in state(agent).get(other, {}).get("holders", []) if h["pod"] == "exporter" and h["container"]]
        return named[0] if named else None

    marked = wait_for(exporter_holder, timeout=30, what=f"the exporter's open of {other}, named\n{agent.log()}")
    assert (marked["namespace"], marked.get("infrastructure")) == (namespace, namespace)
    assert state(agent)[other]["state"] == "free"  # the host daemon and the infrastructure pod: nobody uses it
    assert f"runs in the infrastructure namespace {namespace}" in agent.log_path.read_text(errors="replace")
    assert agent.running(), agent.log()

    # The agent restarts while both pods hold their cards. Its pod watch starts after the restore, so
    # the holders restored in the listed namespace are undecided until its first list is in (neither
    # use nor judged), then judged again: the exporter infrastructure, the job's container a tenant.
    offset = agent.log_path.stat().st_size
    agent.stop()
    agent.start()

    def new_log() -> str:
        with agent.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    wait_for(lambda: "judged now" in new_log(), timeout=60, what=f"the restored holders judged\n{agent.log()}")

    def judged() -> dict[str, Any] | None:  # the file is written behind the log line
        after = state(agent)
        by_pod = {h["pod"]: h for p in cards for h in after[p]["holders"] if h["pod"]}
        marks = {pod: (h.get("infrastructure"), h.get("undecided", False)) for pod, h in by_pod.items()}
        return after if marks == {"job": ("", False), "exporter": (namespace, False)} else None

    after = wait_for(judged, timeout=10, what=f"the judged holders in the state file\n{agent.log()}")
    assert (after[mine]["state"], after[other]["state"]) == ("busy", "free")
    assert "has not listed this node's pods" not in new_log()  # judged by the list, not by the deadline
    assert agent.running(), agent.log()
