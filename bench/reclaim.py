"""Owner reclaim latency of a lent card, with real processes in real containers.

    python3 bench/reclaim.py --json [--cycles 5] [--trigger open|activity]
                                                 [--placement extender|hand]

A real kube-apiserver and a real kubelet with containerd and runc (gpupool testenv), and
``gpupool node-agent --lending`` with one stand-in card (16 GiB). The owner pod books 12 GiB of it
and holds the card open without computing, so the usage monitor calls it idle after
``--idle-after`` (2 s here) and the agent lends it: ``lendable`` on the Node, ``lend-`` devices in
the plugin. Each cycle a borrower pod asking 8 GiB (more than the 4 GiB left free) is placed on the
lent card and runs ``examples/checkpoint_worker.sh`` holding the card.

``--placement extender`` (the default): the real kube-scheduler with the shipped configuration
calls the real ``gpupool extender``, which places the owner and then each borrower (a bare pod
annotated ``gpupool.io/borrow: "true"``) on the loan; ``borrower_placed_s`` runs from the
borrower's creation to its container running. ``--placement hand``: both are bound by hand
(nodeName plus the assignment and borrower annotations the extender would write).

Then the owner opens the card again (a new process in the owner's container, started when the
bench creates a trigger file) and the clock runs from that moment (the trigger's creation, so the
owner's 50 ms polling counts against it) until the card is back with the owner: no process of the
borrower's container left on the host and the Node's ``lendable`` annotation without card 0
(published after the lent devices are withdrawn).

``--trigger activity``: the owner does not open the card again; its container's interception-library
region (written by the bench at the agent's ``--state-dir``, as the library would) shows 1 GiB more
memory on the card, and the clock runs from that write until the card is back. Afterwards the owner
opens the card (untimed) so that the monitor sees it busy and lends it again for the next cycle.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import stat
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.api.annotations import Assignment, CardRef, ContainerCards, encode_assignment
from gpupool.api.lending import LendingNames, decode_lendable
from gpupool.api.names import ResourceNames
from gpupool.nodeagent.lending.processes import PodProcesses, ProcfsProcesses
from gpupool.testing.shim_regions import write_region

NAMES, LEND = ResourceNames(), LendingNames()
WORKER = Path(__file__).resolve().parents[1] / "examples" / "checkpoint_worker.sh"
TARGET_S = 5.0
OWNER_MIB, BORROWER_MIB, CARD_MIB, MEM_UNIT_MIB = 12 * 1024, 8 * 1024, 16 * 1024, 256
CORE_PERCENT = 30
PLACEMENTS = ("extender", "hand")
#: The owner: one process holds card 0 (and forks nothing), and at each trigger file one more process
#: opens it. The polling loop does not hold the card: a child forked while the card is open holds it
#: until it closes it, and the /proc scan may record that as the owner opening the card again.
OWNER = ('sh -c \'exec 3<"$CARD"; exec sleep 3600\' & i=1; while :; do while [ ! -e /trigger/go-$i ]; do sleep 0.05; '
         'done; sh -c \'exec 4<"$CARD"; exec sleep 3600\' & i=$((i + 1)); done')


def pod(name: str, node: str, image: str, command: str, annotations: dict[str, str], card: str, mib: int,
        scheduler: str | None, trigger: str | None = None) -> dict[str, Any]:
    """A busybox pod asking ``mib`` of the card: for ``scheduler`` on ``node``, or bound to it."""
    volumes = [{"name": "trigger", "hostPath": {"path": trigger}}] if trigger else []
    limits = {NAMES.gpu_mem: str(mib // MEM_UNIT_MIB), NAMES.gpu_core: str(CORE_PERCENT)}
    where: dict[str, Any] = ({"schedulerName": scheduler, "nodeSelector": {"kubernetes.io/hostname": node}}
                             if scheduler else {"nodeName": node})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
            "spec": {**where, "terminationGracePeriodSeconds": 1, "volumes": volumes,
                     "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", command], "resources": {"limits": limits},
                                     "env": [{"name": "CARD", "value": card}],
                                     "volumeMounts": [{"name": "trigger", "mountPath": "/trigger"}] if trigger
                                     else []}]}}


def assignment(node: str, mib: int) -> str:
    return encode_assignment(Assignment(node, dt.datetime.now(dt.UTC), (ContainerCards(
        "c", (CardRef(0, "GPU-real-0000", mib, CORE_PERCENT * 10),)),)))


def one_card(directory: Path) -> str:
    """One stand-in card device (``/dev/random``'s numbers) and the ``--fake-gpus`` file naming it."""
    directory.mkdir(parents=True)
    os.mknod(directory / "nvidia0", 0o666 | stat.S_IFCHR, os.makedev(1, 8))
    return (f"model: Tesla-T4\ndevicePathPrefix: {directory}/nvidia\n"
            f"cards:\n  - {{uuid: GPU-real-0000, memoryMiB: {CARD_MIB}}}\n")


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


def run(cycles: int, trigger_kind: str = "open", placement: str = "extender") -> dict[str, Any]:
    from kubernetes import client

    from bench.reclaim_cluster import CONTROL_NODES, Extender, NodeAgent, run_scheduler  # loads gpupool.testenv
    from gpupool.kube.client_config import api_configuration
    from gpupool.testenv.build import ensure_binaries
    from gpupool.testenv.controlplane import start_control_plane
    from gpupool.testenv.kubelet import start_kubelet
    from gpupool.testenv.runtime_tools import ensure_runtime_tools, runtime_impossible_reason

    reason = runtime_impossible_reason()
    if reason is not None:
        raise SystemExit(f"real containers cannot run here: {reason}")
    ensure_runtime_tools(lambda m: print(m, file=sys.stderr))
    work = Path(tempfile.mkdtemp(prefix="gpupool-reclaim-"))
    binaries = ensure_binaries(lambda m: print(m, file=sys.stderr))
    plane = start_control_plane(binaries, with_scheduler=False)
    kubelet = agent = extender = scheduler_process = None
    scheduler: str | None = None
    try:
        core = client.CoreV1Api(client.ApiClient(api_configuration(str(plane.kubeconfig))))
        if placement == "extender":
            extender = Extender(plane.kubeconfig, work / "extender.log")
            extender.start()
            scheduler = f"gpupool-reclaim-{uuid.uuid4().hex[:6]}"
            scheduler_process = run_scheduler(binaries, plane, work, extender.url, scheduler)
        kubelet = start_kubelet(plane, f"reclaim-{uuid.uuid4().hex[:6]}", runtime="containerd",
                                device_nodes=CONTROL_NODES)
        node, image = kubelet.node_name, kubelet.images.busybox.ref
        (work / "agent").mkdir()
        agent = NodeAgent(kubelet, plane.kubeconfig, one_card(work / "dev"), work / "agent",
                          ("--lending", "--idle-after", "2s", "--checkpoint-dir", str(work / "ckpt"),
                           "--checkpoint-deadline", "3", "--lease-namespace", "",
                           "--state-dir", str(work / "state"), "--isolation", "none"))  # fake cards
        agent.start()
        card = f"{work / 'dev'}/nvidia0"
        trigger = work / "trigger"
        trigger.mkdir()
        wait(lambda: (core.read_node(node).status.allocatable or {}).get(NAMES.gpu_mem), 60, "gpupool devices")
        owner_notes = {} if scheduler else {NAMES.assignment: assignment(node, OWNER_MIB)}
        core.create_namespaced_pod("default", pod("owner", node, image, OWNER, owner_notes, card, OWNER_MIB,
                                                  scheduler, str(trigger)))
        wait(lambda: container_id(core, "default", "owner"), 90, "owner running")
        owner_uid = str(core.read_namespaced_pod("owner", "default").metadata.uid)
        script = WORKER.read_text()
        samples, stages, placed, resumed = [], [], [], 0
        if trigger_kind == "activity":
            write_region(work / "state", owner_uid, {0: (0, 0)})  # the owner's library: nothing allocated yet
        for i in range(1, cycles + 1):
            wait(lambda: 0 in lent_cards(core, node), 60, f"card 0 lent (cycle {i})\n{agent.log()}")
            notes = {LEND.checkpoint_key: "bench-borrower"}  # each borrower continues the last one's task
            notes.update({LEND.borrow: "true"} if scheduler else {
                NAMES.assignment: assignment(node, BORROWER_MIB), LEND.borrowed: "true",
                LEND.borrowed_from: "default/owner"})
            name = f"borrower-{i}"
            created = time.monotonic()
            core.create_namespaced_pod("default", pod(name, node, image, script, notes, card, BORROWER_MIB, scheduler))
            cid = wait(lambda n=name: container_id(core, "default", n), 90, f"{name} running\n{agent.log()}")
            placed.append(time.monotonic() - created)
            _check_borrower(core, name)
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
            print(f"cycle {i}: borrower placed and running {placed[-1]:.2f} s; owner {trigger_kind} -> card back "
                  f"{samples[-1]:.2f} s (borrower stopped {stopped:.2f} s)", file=sys.stderr)
        checkpoints = sorted(p.name for p in (work / "ckpt").rglob("ckpt-*"))
        return {"owner_reclaim_p99_s": _p99(samples), "owner_reclaim_median_s": statistics.median(samples),
                "borrower_stopped_median_s": statistics.median(stages), "cycles": cycles,
                "samples_s": [round(s, 3) for s in samples], "checkpoints_written": len(checkpoints),
                "borrower_placed_s": round(statistics.median(placed), 3),
                "borrower_placed_max_s": round(max(placed), 3),
                "borrower_placed_samples_s": [round(s, 3) for s in placed],
                "borrowers_resumed": resumed, "target_s": TARGET_S, "placement": placement,
                "trigger": trigger_kind, "load_average": [round(x, 2) for x in os.getloadavg()]}
    finally:
        if scheduler_process is not None:
            scheduler_process.stop()
        if extender is not None:
            extender.stop()
        if agent is not None:
            agent.stop()
        if kubelet is not None:
            kubelet.stop(delete_node=True)
        plane.stop()


def _check_borrower(core: Any, name: str) -> None:
    """The running borrower carries the marks the node agent vouched by (bind wrote them)."""
    notes = core.read_namespaced_pod(name, "default").metadata.annotations or {}
    if notes.get(LEND.borrowed) != "true" or notes.get(LEND.borrowed_from) != "default/owner":
        raise AssertionError(f"{name} runs without the borrower marks: {notes}")


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
    parser.add_argument("--placement", choices=PLACEMENTS, default="extender",
                        help="borrowers placed by kube-scheduler and the extender, or bound by hand")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.cycles, args.trigger, args.placement)
    print(f"{'cycle':>6} {'owner ' + args.trigger + ' -> card back (s)':>32}")
    for i, s in enumerate(result["samples_s"], 1):
        print(f"{i:>6} {s:>32.3f}")
    print(f"p99 {result['owner_reclaim_p99_s']:.3f} s, median {result['owner_reclaim_median_s']:.3f} s "
          f"(target <= {TARGET_S:g} s); borrower created to running {result['borrower_placed_s']:.3f} s "
          f"(median, {args.placement})")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
