"""Owner reclaim latency of a lent card, with real processes in real containers.

    PYTHONPATH=. python3 bench/reclaim.py --json [--cycles 5] [--trigger open|activity]

A real kube-apiserver and a real kubelet (v1.20.2) with containerd and runc (gpupool testenv), and
``gpupool node-agent --lending`` with stand-in card devices. The owner pod books 4 GiB of card 0 and
holds the card open without computing, so the usage monitor calls it idle after ``--idle-after``
(2 s here) and the agent lends it: ``lendable`` on the Node, ``lend-`` devices in the plugin. Each
cycle a borrower pod is bound by hand onto the lent card (nodeName plus the assignment and borrower
annotations the extender will write; the extender side of lending is not part of this bench) and
runs ``examples/checkpoint_worker.sh`` holding the card. Then the owner opens the card again (a new
process in the owner's container, started when the bench creates a trigger file) and the clock
runs from that moment (the trigger's creation, so the owner's 50 ms polling counts against it) until
the card is back with the owner: no process of the borrower's container left on the host and the
Node's ``lendable`` annotation without card 0 (published after the lent devices are withdrawn).

``--trigger activity``: the owner does not open the card again; its container's interception-library
region (written by the bench at the agent's ``--state-dir``, as the library would) shows 1 GiB more
memory on the card, and the clock runs from that write until the card is back. Afterwards the owner
opens the card (untimed) so that the monitor sees it busy and lends it again for the next cycle.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from gpupool.api.annotations import Assignment, CardRef, ContainerCards, encode_assignment
from gpupool.api.lending import LendingNames, decode_lendable
from gpupool.api.names import ResourceNames
from gpupool.nodeagent.lending.processes import PodProcesses, ProcfsProcesses
from tests.nodeagent.lending.regions import write_region

NAMES, LEND = ResourceNames(), LendingNames()
WORKER = Path(__file__).resolve().parents[1] / "examples" / "checkpoint_worker.sh"
TARGET_S = 5.0
SHARE = {NAMES.gpu_mem: "16", NAMES.gpu_core: "30"}
#: The owner: one process holds card 0 (and forks nothing), and at each trigger file one more process
#: opens it. The polling loop does not hold the card: a child forked while the card is open holds it
#: until it closes it, and the /proc scan may record that as the owner opening the card again.
OWNER = ('sh -c \'exec 3<"$CARD"; exec sleep 3600\' & i=1; while :; do while [ ! -e /trigger/go-$i ]; do sleep 0.05; '
         'done; sh -c \'exec 4<"$CARD"; exec sleep 3600\' & i=$((i + 1)); done')


def pod(name: str, node: str, image: str, command: str, annotations: dict[str, str], card: str,
        trigger: str | None = None) -> dict[str, Any]:
    volumes = [{"name": "trigger", "hostPath": {"path": trigger}}] if trigger else []
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "volumes": volumes,
                     "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", command], "resources": {"limits": SHARE},
                                     "env": [{"name": "CARD", "value": card}],
                                     "volumeMounts": [{"name": "trigger", "mountPath": "/trigger"}] if trigger
                                     else []}]}}


def assignment(node: str) -> str:
    return encode_assignment(Assignment(node, dt.datetime.now(dt.UTC),
                                        (ContainerCards("c", (CardRef(0, "GPU-real-0000", 4096, 300),)),)))


def wait(probe: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(what)


def lent_cards(core: Any, node: str) -> set[int]:
    raw = (core.read_node(node).metadata.annotations or {}).get(LEND.lendable)
    return {c.index for c in decode_lendable(raw).cards} if raw else set()


def container_id(core: Any, namespace: str, name: str) -> str | None:
    p = core.read_namespaced_pod(name, namespace)
    statuses = p.status.container_statuses or []
    if p.status.phase != "Running" or not statuses or not statuses[0].container_id:
        return None
    return str(statuses[0].container_id).partition("://")[2]


def run(cycles: int, trigger_kind: str = "open") -> dict[str, Any]:
    from kubernetes import client

    from gpupool.kube.client_config import api_configuration
    from gpupool.testenv.build import ensure_binaries
    from gpupool.testenv.controlplane import start_control_plane
    from gpupool.testenv.kubelet import start_kubelet
    from gpupool.testenv.runtime_tools import ensure_runtime_tools, runtime_impossible_reason
    from tests.e2e.e2e_support import NodeAgentProcess
    from tests.e2e.real_containers import CONTROL_NODES, stand_in_cards

    reason = runtime_impossible_reason()
    if reason is not None:
        raise SystemExit(f"real containers cannot run here: {reason}")
    ensure_runtime_tools(lambda m: print(m, file=sys.stderr))
    work = Path(tempfile.mkdtemp(prefix="gpupool-reclaim-"))
    plane = start_control_plane(ensure_binaries(lambda m: print(m, file=sys.stderr)), with_scheduler=False)
    kubelet = agent = None
    try:
        core = client.CoreV1Api(client.ApiClient(api_configuration(str(plane.kubeconfig))))
        kubelet = start_kubelet(plane, f"reclaim-{uuid.uuid4().hex[:6]}", runtime="containerd",
                                device_nodes=CONTROL_NODES)
        node, image = kubelet.node_name, kubelet.images.busybox.ref
        (work / "agent").mkdir()
        agent = NodeAgentProcess(kubelet, plane.kubeconfig, stand_in_cards(work / "dev"), work / "agent",
                                 ("--lending", "--idle-after", "2s", "--checkpoint-dir", str(work / "ckpt"),
                                  "--checkpoint-deadline", "3", "--lease-namespace", "",
                                  "--state-dir", str(work / "state")))
        agent.start()
        card = f"{work / 'dev'}/nvidia0"
        trigger = work / "trigger"
        trigger.mkdir()
        wait(lambda: (core.read_node(node).status.allocatable or {}).get(NAMES.gpu_mem), 60, "gpupool devices")
        core.create_namespaced_pod("default", pod("owner", node, image, OWNER, {NAMES.assignment: assignment(node)},
                                                  card, str(trigger)))
        wait(lambda: container_id(core, "default", "owner"), 90, "owner running")
        owner_uid = str(core.read_namespaced_pod("owner", "default").metadata.uid)
        script = WORKER.read_text()
        samples, stages, resumed = [], [], 0
        if trigger_kind == "activity":
            write_region(work / "state", owner_uid, {0: (0, 0)})  # the owner's library: nothing allocated yet
        for i in range(1, cycles + 1):
            wait(lambda: 0 in lent_cards(core, node), 60, f"card 0 lent (cycle {i})\n{agent.log()}")
            notes = {NAMES.assignment: assignment(node), LEND.borrowed: "true", LEND.borrowed_from: "default/owner",
                     LEND.checkpoint_key: "bench-borrower"}  # each borrower continues the last one's task
            name = f"borrower-{i}"
            core.create_namespaced_pod("default", pod(name, node, image, script, notes, card))
            cid = wait(lambda n=name: container_id(core, "default", n), 90, f"{name} running\n{agent.log()}")
            procs = PodProcesses("", frozenset({cid}))
            try:
                wait(lambda p=procs: ProcfsProcesses().pids(p), 10, f"{name}'s processes")
            except TimeoutError:
                status = core.read_namespaced_pod(name, "default").status
                raise TimeoutError(f"{name}'s processes (container {cid}): {status.container_statuses}\n"
                                   f"{core.read_namespaced_pod_log(name, 'default')}\n{agent.log()}") from None
            time.sleep(1.5)  # the borrower's open recorded and allowed (the card stays lent)
            first = str(core.read_namespaced_pod_log(name, "default")).splitlines()[:1]
            resumed += bool(first and first[0].startswith("resumed from /var/run/gpupool/checkpoint/ckpt-"))
            assert 0 in lent_cards(core, node), f"{name}'s open ended the loan\n{agent.log()}"
            began = time.monotonic()
            if trigger_kind == "activity":
                write_region(work / "state", owner_uid, {0: (1024, 0)})
            else:
                (trigger / f"go-{i}").touch()
            wait(lambda p=procs: not ProcfsProcesses().pids(p), 30, f"{name} stopped\n{agent.log()}", 0.01)
            stopped = time.monotonic() - began
            wait(lambda: 0 not in lent_cards(core, node), 30, "card 0 withdrawn", 0.02)
            samples.append(time.monotonic() - began)
            stages.append(stopped)
            wait(lambda n=name: _gone_or_failed(core, n), 60, f"{name} evicted\n{agent.log()}")
            if trigger_kind == "activity":  # back to the lent baseline; an open makes the card busy, then idle again
                write_region(work / "state", owner_uid, {0: (0, 0)})
                (trigger / f"go-{i}").touch()
            print(f"cycle {i}: owner {trigger_kind} -> card back {samples[-1]:.2f} s "
                  f"(borrower stopped {stopped:.2f} s)", file=sys.stderr)
        checkpoints = sorted(p.name for p in (work / "ckpt").rglob("ckpt-*"))
        return {"owner_reclaim_p99_s": _p99(samples), "owner_reclaim_median_s": statistics.median(samples),
                "borrower_stopped_median_s": statistics.median(stages), "cycles": cycles,
                "samples_s": [round(s, 3) for s in samples], "checkpoints_written": len(checkpoints),
                "borrowers_resumed": resumed,
                "target_s": TARGET_S, "placement": "borrowers bound by hand (nodeName + annotations)",
                "trigger": trigger_kind}
    finally:
        if agent is not None:
            agent.stop()
        if kubelet is not None:
            kubelet.stop(delete_node=True)
        plane.stop()


def _gone_or_failed(core: Any, name: str) -> bool:
    from kubernetes.client.rest import ApiException

    try:
        p = core.read_namespaced_pod(name, "default")
    except ApiException as exc:
        return exc.status == 404
    return p.metadata.deletion_timestamp is not None or p.status.phase in ("Failed", "Succeeded")


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--trigger", choices=("open", "activity"), default="open",
                        help="the owner opens the card again, or computes again without an open (its region)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.cycles, args.trigger)
    print(f"{'cycle':>6} {'owner ' + args.trigger + ' -> card back (s)':>32}")
    for i, s in enumerate(result["samples_s"], 1):
        print(f"{i:>6} {s:>32.3f}")
    print(f"p99 {result['owner_reclaim_p99_s']:.3f} s, median {result['owner_reclaim_median_s']:.3f} s "
          f"(target <= {TARGET_S:g} s)")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
