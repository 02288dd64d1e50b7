"""Process checkpoints with CRIU inside the container, end to end in real containers (kubelet,
containerd 2.4, runc).

The pinned containerd cannot restore a container (its CRI restore is gone), so gpupool's wrapper
``criu-run`` runs CRIU inside the workload's container (docs/lending.md, "Process checkpoints with
CRIU"). Here a busybox image (no C library: the wrapper and CRIU 4.1.1 are static) gets the two
programs from a host directory mounted where a grant would mount them, and the checkpoint
protocol's environment and directory as the node agent hands them out:

1. Pod one runs ``criu-run -- sh -c <counter>``; the counter prints ``count <n>`` twice a second and
   keeps its count only in its shell's memory (no file, no application checkpoint).
2. The checkpoint signal (SIGUSR1, sent to the wrapper as the container's process 1) makes the
   wrapper dump the counter's processes into ``criu-1`` of the checkpoint directory; the pod ends
   with 0. The agent's choice of what to resume from takes that directory.
3. Pod two, started with ``GPUPOOL_RESUME_FROM`` naming it, restores the counter instead of starting
   it: the first count in its log is the one after the last count pod one printed (not 1), printed
   by the restored shell into the new container's log.

A stand-in ``cuda-checkpoint`` lies beside CRIU there (a shell script: the counter's shell is a
``running`` CUDA process to it, every other process is none), so the case also shows criu-run's
toggles around a real dump and restore: the counter's shell toggled before the dump and listed in
its ``cuda-pids``, toggled back after the restore. No GPU: what the real tool does to device
memory is not shown.

The second case runs the same through ``gpupool node-agent --lending --criu --criu-dir <tmpfs>``:
the agent writes CRIU, criu-run and CRIU's kernel cache into the directory, the grant of a gpupool
pod annotated ``gpupool.io/checkpoint: process`` mounts it (and the task's checkpoint directory;
the pod has no volume or env of its own), and the task's next pod is told by the agent to resume
from ``criu-1``. The signal is sent by the test there; in the third case by the agent's reclaim
(an owner opening its lent card), which signals ``criu-run`` alone.

Capabilities: the containers add exactly ``CHECKPOINT_RESTORE`` and ``SYS_PTRACE``
(:data:`CAPABILITIES`) to the runtime's default set; no privileged container, no ``SYS_ADMIN``: CRIU
runs with ``--unprivileged`` and reads its kernel-feature cache (``criu.kdat``, written on the host
by ``criu check``) beside it instead of probing the kernel.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from bench import reclaim as reclaim_bench
from bench.reclaim import BORROWER_MIB, CARD_MIB, OWNER, OWNER_MIB, assignment, lent_cards, one_card
from gpupool.api.lending import (
    CHECKPOINT_DIR_ENV,
    CHECKPOINT_MOUNT,
    CHECKPOINT_SIGNAL,
    CHECKPOINT_SIGNAL_ENV,
    PROCESS_CHECKPOINT,
    RESUME_FROM_ENV,
    LendingNames,
)
from gpupool.api.names import ResourceNames
from gpupool.nodeagent.lending.checkpoint_files import newest_checkpoint
from gpupool.nodeagent.lending.criu_tools import CRIU_MOUNT
from gpupool.shim.build import ShimBuildError
from gpupool.shim.criu_run_build import build_criu_run
from gpupool.testenv.criu import criu_impossible_reason, criu_version, ensure_criu
from gpupool.testenv.errors import BuildFailedError, BuildImpossibleError
from gpupool.testenv.images import Base, build_image
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.e2e_support import ExtenderProcess, NodeAgentProcess, pod_gone, wait_for
from tests.e2e.real_containers import stand_in_cards

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

TOOLS_MOUNT = CRIU_MOUNT
NAMES = ResourceNames()
LEND = LendingNames()
CAPABILITIES = ["CHECKPOINT_RESTORE"]
COUNT = re.compile(r"^count (\d+)$", re.MULTILINE)


def counter(marker: str) -> str:
    """A shell counting in its own memory; ``marker`` makes its wrapper's command line unique."""
    return f': {marker}; i=0; while :; do i=$((i+1)); echo "count $i"; sleep 0.5; done'


def pod_manifest(name: str, node: str, marker: str, tools: Path, checkpoints: Path,
                 resume_from: str | None = None) -> dict[str, Any]:
    env = [{"name": CHECKPOINT_DIR_ENV, "value": CHECKPOINT_MOUNT},
           {"name": CHECKPOINT_SIGNAL_ENV, "value": CHECKPOINT_SIGNAL},
           {"name": "GPUPOOL_CRIU", "value": f"{TOOLS_MOUNT}/criu"}]
    if resume_from is not None:
        env.append({"name": RESUME_FROM_ENV, "value": resume_from})
    container = {"name": "main", "image": "", "imagePullPolicy": "Never",
                 "command": [f"{TOOLS_MOUNT}/criu-run", "--", "sh", "-c", counter(marker)], "env": env,
                 "securityContext": {"capabilities": {"add": CAPABILITIES}},
                 "volumeMounts": [{"name": "tools", "mountPath": TOOLS_MOUNT, "readOnly": True},
                                  {"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], "restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                     "volumes": [{"name": "tools", "hostPath": {"path": str(tools), "type": "Directory"}},
                                 {"name": "checkpoints", "hostPath": {"path": str(checkpoints), "type": "Directory"}}],
                     "nodeSelector": {"kubernetes.io/hostname": node}}}


#: A stand-in cuda-checkpoint run inside the container (busybox sh): a process whose command line
#: carries MARKER is a CUDA process, its state kept in the checkpoint directory (it outlives the pod),
#: every call logged there.
STAND_IN_CUDA_CHECKPOINT = """#!/bin/sh
echo "$*" >> "$GPUPOOL_CHECKPOINT_DIR/.cuda-calls"
grep -q MARKER "/proc/$3/cmdline" 2>/dev/null || { echo "not a CUDA process" >&2; exit 1; }
state="$GPUPOOL_CHECKPOINT_DIR/.cuda-state"
now=$(cat "$state" 2>/dev/null || echo running)
case "$1" in
--get-state) echo "$now" ;;
--toggle) if [ "$now" = running ]; then echo checkpointed > "$state"; else echo running > "$state"; fi ;;
esac
"""


def write_kerndat_cache(criu: Path, tools: Path) -> None:
    """CRIU's kernel-feature cache beside it, as the node writes it: ``criu check --unprivileged`` on
    the host, on a tmpfs (CRIU keeps its cache only there). Without it CRIU's probes in the container
    need CAP_SYS_ADMIN (one mounts a tmpfs)."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as runtime:
        done = subprocess.run([str(criu), "check", "--unprivileged"], env={**os.environ, "XDG_RUNTIME_DIR": runtime},
                              capture_output=True, text=True, timeout=60, check=False)
        cache = Path(runtime) / "criu.kdat"
        assert done.returncode == 0 and cache.is_file(), (done.returncode, done.stdout, done.stderr)
        (tools / "criu.kdat").write_bytes(cache.read_bytes())


def wrapper_pid(marker: str) -> int | None:
    """The host pid of the container's process 1 whose command line carries ``marker``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        ours = marker.encode() in cmdline and cmdline.startswith(f"{TOOLS_MOUNT}/criu-run".encode())
        if ours and nspid[-1:] == ["1"]:
            return int(entry)
    return None


def counts(log: str) -> list[int]:
    return [int(n) for n in COUNT.findall(log)]


def pod_log(core_v1: client.CoreV1Api, namespace: str, name: str, container: str = "main") -> str:
    try:
        return str(core_v1.read_namespaced_pod_log(name, namespace, container=container))
    except client.ApiException:
        return ""


def built_criu() -> tuple[Path, Path]:
    """CRIU (built into the test environment's cache on first use) and criu-run; skips where neither can be."""
    reason = criu_impossible_reason()
    if reason is not None:
        pytest.skip(f"CRIU cannot be built here: {reason}")
    try:
        began = time.monotonic()
        criu = ensure_criu(log=lambda m: print(f"[gpupool testenv] {m}", flush=True))
        print(f"\n  CRIU ({criu_version(criu)}) ready in {time.monotonic() - began:.1f} s")
        return criu, build_criu_run(werror=True)
    except (BuildImpossibleError, ShimBuildError) as exc:
        pytest.skip(f"CRIU or criu-run cannot be built here: {exc}")
    except BuildFailedError as exc:
        pytest.fail(str(exc))


def test_a_counter_dumped_by_criu_in_its_container_continues_its_count_in_the_next_pod(
    core_v1: client.CoreV1Api, namespace: str, containerd_kubelet: Kubelet, tmp_path: Path,
) -> None:
    criu, wrapper = built_criu()
    tools = tmp_path / "tools"
    tools.mkdir()
    for program, source in (("criu", criu), ("criu-run", wrapper)):
        (tools / program).write_bytes(source.read_bytes())
        (tools / program).chmod(0o755)
    write_kerndat_cache(criu, tools)
    checkpoints = tmp_path / "checkpoint"
    checkpoints.mkdir(mode=0o777)
    image = build_image("criu-counter", base=Base.BUSYBOX)  # busybox only: no C library in the image
    containerd_kubelet.import_image(image)
    node = containerd_kubelet.node_name
    marker = f"criu-e2e-{uuid.uuid4().hex[:8]}"
    (tools / "cuda-checkpoint").write_text(STAND_IN_CUDA_CHECKPOINT.replace("MARKER", marker))
    (tools / "cuda-checkpoint").chmod(0o755)

    def create(name: str, resume_from: str | None = None) -> None:
        manifest = pod_manifest(name, node, marker, tools, checkpoints, resume_from)
        manifest["spec"]["containers"][0]["image"] = image.ref
        core_v1.create_namespaced_pod(namespace, manifest)

    create("first")
    wait_for(lambda: len(counts(pod_log(core_v1, namespace, "first"))) >= 4, timeout=90,
             what="the first pod's counter to count")
    pid = wait_for(lambda: wrapper_pid(marker), timeout=10, what="the wrapper as the container's process 1")
    os.kill(pid, signal.SIGUSR1)
    signalled = time.monotonic()
    def ended() -> str | None:
        phase = core_v1.read_namespaced_pod("first", namespace).status.phase
        return str(phase) if phase in ("Succeeded", "Failed") else None

    phase = wait_for(ended, timeout=30, what="the first pod to end after the checkpoint signal")
    first_log = pod_log(core_v1, namespace, "first")
    print(f"  signal to the first pod's end: {time.monotonic() - signalled:.1f} s")
    assert phase == "Succeeded", first_log
    assert "criu-run: dumped process" in first_log, first_log
    last = counts(first_log)[-1]
    dump = checkpoints / "criu-1"
    assert (dump / "inventory.img").is_file(), sorted(p.name for p in checkpoints.iterdir())
    assert newest_checkpoint(str(checkpoints)) == "criu-1"  # what the agent would name in GPUPOOL_RESUME_FROM
    print(f"  dump: {sum(f.stat().st_size for f in dump.iterdir()) / 1024:.0f} KiB, last count {last}")
    # the counter's shell (the wrapper's child) was toggled before CRIU dumped it, and is listed in the dump
    shell = int((dump / "cuda-pids").read_text())
    dumped_calls = (checkpoints / ".cuda-calls").read_text().splitlines()
    assert dumped_calls[:2] == [f"--get-state --pid {shell}", f"--toggle --pid {shell}"], dumped_calls
    assert [c for c in dumped_calls if c.startswith("--toggle")] == [f"--toggle --pid {shell}"]
    assert "suspended 1 CUDA process(es)" in first_log and (checkpoints / ".cuda-state").read_text() == "checkpointed\n"

    create("second", resume_from=f"{CHECKPOINT_MOUNT}/criu-1")
    def restored_log() -> str | None:
        log = pod_log(core_v1, namespace, "second")
        return log if len(counts(log)) >= 3 else None

    second_log = wait_for(restored_log, timeout=90, what="the second pod's restored counter to count",
                          explain=lambda: pod_log(core_v1, namespace, "second"))
    assert "criu-run: restored process" in second_log, second_log
    # the restored shell kept its pid and was toggled back before it went on counting
    assert (checkpoints / ".cuda-calls").read_text().splitlines()[len(dumped_calls):] == [
        f"--get-state --pid {shell}", f"--toggle --pid {shell}"]
    assert "put 1 CUDA process(es) back on the GPU" in second_log
    assert (checkpoints / ".cuda-state").read_text() == "running\n"
    resumed = counts(second_log)
    assert resumed[0] == last + 1 and resumed == list(range(last + 1, last + 1 + len(resumed))), (first_log, second_log)
    assert core_v1.read_namespaced_pod("second", namespace).status.phase == "Running"


def agent_pod(name: str, node: str, image: str, marker: str) -> dict[str, Any]:
    """A gpupool pod of task ``counter`` asking for process checkpoints: no volume, no env of its own;
    the agent's grant mounts the checkpoint directory and the tools and names what to resume from."""
    container = {"name": "main", "image": image, "imagePullPolicy": "Never",
                 "command": [f"{TOOLS_MOUNT}/criu-run", "--", "sh", "-c", counter(marker)],
                 "securityContext": {"capabilities": {"add": CAPABILITIES}},
                 "resources": {"limits": {NAMES.gpu_mem: "16"}}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {LEND.checkpoint: PROCESS_CHECKPOINT,
                                                       LEND.checkpoint_key: "counter"}},
            "spec": {"containers": [container], "restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                     "nodeSelector": {"kubernetes.io/hostname": node}}}


def test_the_agent_mounts_criu_run_and_names_the_dump_to_resume_from(
    core_v1: client.CoreV1Api, namespace: str, containerd_kubelet: Kubelet, tmp_path: Path,
    start_node_agent: Callable[..., NodeAgentProcess], gpupool_extender: ExtenderProcess,
) -> None:
    """``node-agent --lending --criu``: the grant of a pod annotated ``gpupool.io/checkpoint: process``
    mounts CRIU, criu-run and the kernel cache (written by the agent on a tmpfs); the dump goes to the
    task's directory, and the task's next pod gets ``GPUPOOL_RESUME_FROM`` naming it from the agent."""
    criu, _ = built_criu()
    image = build_image("criu-counter", base=Base.BUSYBOX)
    containerd_kubelet.import_image(image)
    node = containerd_kubelet.node_name
    cards = stand_in_cards(tmp_path / "dev")
    root = tmp_path / "checkpoints"
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tools:
        agent = start_node_agent(containerd_kubelet, cards,
                                 ("--lending", "--checkpoint-dir", str(root), "--lease-namespace", "",
                                  "--criu", str(criu), "--criu-dir", tools))
        wait_for(lambda: "registered" in agent.log_path.read_text(errors="replace"), timeout=60,
                 what=f"the agent's devices on {node}", explain=agent.log)
        wait_for(lambda: (core_v1.read_node(node).status.allocatable or {}).get(NAMES.gpu_mem), timeout=60,
                 what=f"gpupool devices on {node}", explain=agent.log)
        # and a copy of cuda-checkpoint where the agent finds one on its PATH (a GPU node's driver 550+)
        written = ["criu", "criu-run", "criu.kdat", *(["cuda-checkpoint"] if shutil.which("cuda-checkpoint") else [])]
        assert sorted(os.listdir(tools)) == written, agent.log()
        marker = f"criu-agent-{uuid.uuid4().hex[:8]}"
        core_v1.create_namespaced_pod(namespace, agent_pod("first", node, image.ref, marker))
        wait_for(lambda: len(counts(pod_log(core_v1, namespace, "first"))) >= 4, timeout=90,
                 what=f"the first pod's counter to count\n{agent.log()}",
                 explain=lambda: str(core_v1.read_namespaced_pod("first", namespace).status))
        os.kill(wait_for(lambda: wrapper_pid(marker), timeout=10, what="criu-run as process 1"), signal.SIGUSR1)

        def ended() -> str | None:
            phase = core_v1.read_namespaced_pod("first", namespace).status.phase
            return str(phase) if phase in ("Succeeded", "Failed") else None

        phase = wait_for(ended, timeout=30, what="the first pod's end")
        first_log = pod_log(core_v1, namespace, "first")
        assert phase == "Succeeded", first_log
        last = counts(first_log)[-1]
        [task] = [d for ns in root.iterdir() for d in ns.iterdir()]
        assert (task / "criu-1" / "inventory.img").is_file(), first_log

        core_v1.create_namespaced_pod(namespace, agent_pod("second", node, image.ref, marker))

        def restored_log() -> str | None:
            log = pod_log(core_v1, namespace, "second")
            return log if len(counts(log)) >= 3 else None

        second_log = wait_for(restored_log, timeout=90, what=f"the restored counter\n{agent.log()}",
                              explain=lambda: pod_log(core_v1, namespace, "second"))
        assert "restored process" in second_log and f"{CHECKPOINT_MOUNT}/criu-1" in second_log, second_log
        resumed = counts(second_log)
        assert resumed == list(range(last + 1, last + 1 + len(resumed))), (first_log, second_log)
        core_v1.delete_namespaced_pod("second", namespace, grace_period_seconds=0)


def test_a_borrower_under_criu_run_reclaimed_by_its_owner_continues_its_count_on_the_next_loan(
    core_v1: client.CoreV1Api, namespace: str, containerd_kubelet: Kubelet, tmp_path: Path,
    start_node_agent: Callable[..., NodeAgentProcess],
) -> None:
    """The reclaim drives it: ``node-agent --lending --criu`` lends an idle owner's card (pods bound by
    hand, as ``bench/reclaim.py --placement hand`` does); a borrower annotated ``checkpoint: process``
    counts under ``criu-run`` holding the card; the owner opens its card again and the agent's reclaim
    signals ``criu-run`` alone, which dumps the counter (nothing killed), and the borrower is evicted.
    Once the card is lent again, the task's next borrower restores the counter and counts on."""
    criu, _ = built_criu()
    image = containerd_kubelet.images.busybox.ref
    node = containerd_kubelet.node_name
    root, trigger = tmp_path / "checkpoints", tmp_path / "trigger"
    trigger.mkdir()
    card = f"{tmp_path / 'dev'}/nvidia0"
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tools:
        agent = start_node_agent(containerd_kubelet, one_card(tmp_path / "dev"),
                                 ("--lending", "--idle-after", "2s", "--checkpoint-dir", str(root),
                                  "--checkpoint-deadline", "5", "--lease-namespace", "", "--isolation", "none",
                                  "--state-dir", str(tmp_path / "state"), "--criu", str(criu), "--criu-dir", tools))
        # registered with kubelet: the node may still show the devices of the module's previous agent
        wait_for(lambda: "registered" in agent.log_path.read_text(errors="replace"), timeout=60,
                 what=f"the agent's devices on {node}", explain=agent.log)
        wait_for(lambda: (core_v1.read_node(node).status.allocatable or {}).get(NAMES.gpu_mem) == str(CARD_MIB // 256),
                 timeout=60, what=f"this agent's one card on {node}", explain=agent.log)
        core_v1.create_namespaced_pod(namespace, reclaim_bench.pod(
            "owner", node, image, OWNER, {NAMES.assignment: assignment(node, OWNER_MIB)}, card, OWNER_MIB, None,
            str(trigger)))
        marker = f"criu-loan-{uuid.uuid4().hex[:8]}"
        notes = {NAMES.assignment: assignment(node, BORROWER_MIB), LEND.borrowed: "true",
                 LEND.borrowed_from: f"{namespace}/owner", LEND.checkpoint: PROCESS_CHECKPOINT,
                 LEND.checkpoint_key: "loan-counter"}

        def borrower(name: str) -> dict[str, Any]:
            manifest = reclaim_bench.pod(name, node, image, "", notes, card, BORROWER_MIB, None)
            [container] = manifest["spec"]["containers"]
            container["command"] = [f"{TOOLS_MOUNT}/criu-run", "--", "sh", "-c", f'exec 3<"$CARD"; {counter(marker)}']
            container["securityContext"] = {"capabilities": {"add": CAPABILITIES}}
            return manifest

        wait_for(lambda: 0 in lent_cards(core_v1, node), timeout=60, what="card 0 lent", explain=agent.log)
        core_v1.create_namespaced_pod(namespace, borrower("borrower-1"))
        seen = [""]

        def counting(name: str, at_least: int) -> str | None:
            log = pod_log(core_v1, namespace, name, container="c")  # bench.reclaim's pods: container c
            seen[0] = log or seen[0]
            return log if len(counts(log)) >= at_least else None

        wait_for(lambda: counting("borrower-1", 4), timeout=90, what=f"borrower-1 counting\n{agent.log()}",
                 explain=lambda: str(core_v1.read_namespaced_pod("borrower-1", namespace).status))
        assert 0 in lent_cards(core_v1, node), f"the borrower's open ended the loan\n{agent.log()}"
        (trigger / "go-1").touch()  # the owner opens its card again
        opened = time.monotonic()
        dump = wait_for(lambda: next(root.rglob("criu-1/inventory.img"), None), timeout=30,
                        what=f"the reclaim's dump\n{agent.log()}",
                        explain=lambda: f"{seen[0]}\n{counting('borrower-1', 0) or ''}")
        print(f"  owner's open to the dump renamed into place: {time.monotonic() - opened:.1f} s")
        wait_for(lambda: pod_gone(core_v1, namespace, "borrower-1") or None, timeout=60,
                 what="borrower-1 evicted", explain=agent.log)
        reclaimed = wait_for(lambda: next((line for line in agent.log_path.read_text(errors="replace").splitlines()
                                          if f"reclaimed {namespace}/borrower-1:" in line), None),
                             timeout=30, what="the agent's reclaim line", explain=agent.log)
        assert "1 signalled, 0 killed" in reclaimed, reclaimed  # criu-run alone; the dump ended the rest
        print(f"  {reclaimed.split(' WARNING ')[-1]}")
        last = counts(seen[0])[-1]

        wait_for(lambda: 0 in lent_cards(core_v1, node), timeout=90, what="card 0 lent again", explain=agent.log)
        core_v1.create_namespaced_pod(namespace, borrower("borrower-2"))
        second_log = wait_for(lambda: counting("borrower-2", 3), timeout=90, what="borrower-2 counting",
                              explain=agent.log)
        assert "restored process" in second_log and f"{CHECKPOINT_MOUNT}/{dump.parent.name}" in second_log, second_log
        resumed = counts(second_log)
        assert resumed[0] > last and resumed == list(range(resumed[0], resumed[0] + len(resumed))), (seen, second_log)
        core_v1.delete_namespaced_pod("borrower-2", namespace, grace_period_seconds=0)
        core_v1.delete_namespaced_pod("owner", namespace, grace_period_seconds=0)
