"""Refusal at open in real containers (seed 000, claims 1 and 7; cases A and C): a real kubelet with
containerd and runc, ``gpupool node-agent --lending`` on one stand-in card, this machine's kernel
(6.18: fanotify sees no device opens, so the cgroup-device gate answers).

The owner pod (12 GiB booked by hand) holds its card without computing; the agent lends it. A
borrower pod, bound by hand on the loan, opens the card every 100 ms from new processes and ignores
the checkpoint signal (so it lives until the deadline). The owner opens its card again: the agent
reclaims the borrower, and from then on the borrower's ``open()`` fails with ``EPERM`` in the kernel
(every card of a pod being reclaimed, and rule 3 beside its busy owner) while the owner, never
refused, keeps running and holding the card. The time from the owner's open to the borrower's first
refused open is printed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from bench.reclaim import BORROWER_MIB, OWNER, OWNER_MIB, assignment, one_card, pod
from gpupool.api.lending import LendingNames
from gpupool.api.names import ResourceNames
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.e2e_support import NodeAgentProcess, pod_gone, wait_for
from tests.e2e.test_lending_loop_e2e import allocatable, container_id, holders, lent, running

pytestmark = [pytest.mark.e2e]

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

NAMES, LEND = ResourceNames(), LendingNames()
CARD_MIB = 16 * 1024
DEADLINE_S = 6
BORROWER = (
    "trap '' USR1 TERM; while :; do t=$(cut -d' ' -f1 /proc/uptime); "
    "if out=$(sh -c 'exec 5<\"$CARD\"' 2>&1); then echo \"$t opened\" >> /trigger/borrower.log; "
    "else echo \"$t refused $out\" >> /trigger/borrower.log; fi; sleep 0.1; done"
)


def uptime() -> float:
    with open("/proc/uptime", encoding="ascii") as fh:
        return float(fh.read().split()[0])


def lines(log: Path) -> list[tuple[float, str]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        when, _, what = line.partition(" ")
        try:
            out.append((float(when), what))
        except ValueError:
            continue
    return out


def test_a_reclaimed_borrowers_open_fails_with_eperm_and_the_owner_keeps_running(
        core_v1: client.CoreV1Api, namespace: str, containerd_kubelet: Kubelet, tmp_path: Path,
        start_node_agent: Callable[..., NodeAgentProcess]) -> None:
    kubelet = containerd_kubelet
    node, image = kubelet.node_name, kubelet.images.busybox.ref
    cards = one_card(tmp_path / "dev")
    card, trigger = f"{tmp_path / 'dev'}/nvidia0", tmp_path / "trigger"
    trigger.mkdir()
    agent = start_node_agent(kubelet, cards, (
        "--lending", "--idle-after", "2s", "--checkpoint-deadline", str(DEADLINE_S),
        "--checkpoint-dir", str(tmp_path / "ckpt"), "--lease-namespace", "", "--isolation", "none"))
    wait_for(lambda: allocatable(core_v1, node) == CARD_MIB // 256 or None, timeout=60,
             what=f"the card's devices on {node}\n{agent.log()}")
    assert "device gate (deny opens per container): cgroup-device-bpf" in agent.log_path.read_text(), agent.log()
    core_v1.create_namespaced_pod(namespace, pod("owner", node, image, OWNER, {NAMES.assignment: assignment(
        node, OWNER_MIB)}, card, OWNER_MIB, None, str(trigger)))
    wait_for(lambda: running(core_v1, namespace, "owner"), timeout=90, what=f"the owner Running\n{agent.log()}")
    owner_id = container_id(core_v1, namespace, "owner")
    wait_for(lambda: lent(core_v1, node), timeout=60, what=f"card 0 lent\n{agent.log()}")

    notes = {NAMES.assignment: assignment(node, BORROWER_MIB), LEND.borrowed: "true",
             LEND.borrowed_from: f"{namespace}/owner"}
    core_v1.create_namespaced_pod(namespace, pod("borrower", node, image, BORROWER, notes, card, BORROWER_MIB,
                                                 None, str(trigger)))
    wait_for(lambda: running(core_v1, namespace, "borrower"), timeout=90,
             what=f"the borrower Running on the loan\n{agent.log()}")
    log = trigger / "borrower.log"
    wait_for(lambda: sum(what == "opened" for _, what in lines(log)) >= 5 or None, timeout=30,
             what=f"the borrower opening the lent card\n{lines(log)[-5:]}\n{agent.log()}")
    assert not any(what.startswith("refused") for _, what in lines(log)), "refused while the card was lent"

    back_at = uptime()
    (trigger / "go-1").touch()  # the owner opens its card again
    refused = wait_for(lambda: next(((t, w) for t, w in lines(log) if t > back_at and w.startswith("refused")),
                                    None), timeout=15, interval=0.05,
                       what=f"the borrower refused\n{lines(log)[-5:]}\n{agent.log()}")
    print(f"\n  owner's open to the borrower's first refused open: {(refused[0] - back_at) * 1000:.0f} ms")
    assert "Operation not permitted" in refused[1], refused
    time.sleep(1.0)
    after = [w for t, w in lines(log) if t > refused[0]]
    assert after and all(w.startswith("refused") for w in after), after[-5:]
    assert owner_id in holders(agent, card), "the owner holds its card"
    assert running(core_v1, namespace, "owner") is not None
    wait_for(lambda: pod_gone(core_v1, namespace, "borrower"), timeout=DEADLINE_S + 30,
             what=f"the borrower stopped at the deadline and evicted\n{agent.log()}")
    assert owner_id in holders(agent, card) and running(core_v1, namespace, "owner") is not None
    assert agent.running(), agent.log()
