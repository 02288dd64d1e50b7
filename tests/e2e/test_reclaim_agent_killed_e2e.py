"""A node agent SIGKILLed mid-reclaim finishes the reclaim after its restart, in real containers
(issue 28; the same with real processes and no kubelet: tests/nodeagent/lending/test_restart_mid_reclaim.py).

A real kubelet with containerd and runc, ``gpupool node-agent --lending`` on one stand-in card. The
owner pod (12 GiB booked by hand) holds its card without computing; the agent lends it. A borrower
pod bound by hand on the loan runs ``examples/checkpoint_worker.sh`` ignoring the checkpoint signal
(so only the agent's kill at the deadline ends it). The owner opens its card again; the agent's
first life (run under :mod:`tests.e2e.agent_killed_at_step`) SIGKILLs itself right after its
reclaim journal records the step: after the journal write, after the signal, after the stop. The
agent is started again, unchanged, on the same files. Each time:

- the borrower's processes end and its pod is evicted (a ``GpuReclaimed`` event);
- from the restart until then card 0 is never offered anew: the node shows the dead agent's last
  offer only until the restarted agent is up (it withdraws it before the borrower is gone);
- it is lent again once the owner is idle again (the card is not lost either);
- the restarted agent never reports the owner's processes as a risk, to the end (the owner pod's
  deletion included: kubelet drops it from its list before its processes are gone).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pytest
from kubernetes import client

from bench.reclaim import BORROWER_MIB, OWNER, OWNER_MIB, WORKER, assignment, one_card, pod
from gpupool.api.lending import RECLAIMED_REASON, LendingNames, decode_lendable
from gpupool.api.names import ResourceNames
from gpupool.nodeagent.lending.reclaim_journal import JOURNAL_FILE, ReclaimStep
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.e2e_support import GPUPOOL_CLI, NodeAgentProcess, pod_gone, wait_for
from tests.e2e.test_lending_loop_e2e import allocatable, container_id, holders, lent, running

# Slow: about a minute a case here (two agent starts and two pod starts each).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

NAMES, LEND = ResourceNames(), LendingNames()
CARD_MIB = 16 * 1024
DEADLINE_S = 2
IDLE_AFTER = "2s"
REGISTERED = "resources with kubelet"
RISK_ROUND_S = 2.5
"""One round of the risk checks (every 2 s) after the owner's processes are gone."""
AGENT_START_S = 30
"""Bound on a restarted agent's start (14 s seen on this shared 2-core machine under load)."""
BORROWER = "IGNORE_CHECKPOINT=1\nSTEP_SECONDS=0.2\n" + WORKER.read_text()
"""The example worker, ignoring the signal: it lives until the agent kills it at the deadline."""


def lendable_updated(core_v1: client.CoreV1Api, node: str) -> float | None:
    """When the node's ``lendable`` offer listing card 0 was written (``None``: card 0 not offered)."""
    raw = (core_v1.read_node(node).metadata.annotations or {}).get(LEND.lendable)
    if not raw:
        return None
    offer = decode_lendable(raw)
    return offer.updated if any(c.index == 0 for c in offer.cards) else None


def dying(step: str) -> list[str]:
    """The command before ``node-agent`` for a life that ends by SIGKILL at ``step``."""
    return [GPUPOOL_CLI[0], "-m", "tests.e2e.agent_killed_at_step", step]


@pytest.mark.parametrize("step", [ReclaimStep.RECORDED.label, ReclaimStep.SIGNALLED.label,
                                  ReclaimStep.STOPPED.label])
def test_an_agent_killed_mid_reclaim_finishes_it_after_a_restart(
        step: str, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
        containerd_kubelet: Kubelet, tmp_path: Path) -> None:
    began = time.monotonic()
    kubelet = containerd_kubelet
    node, image = kubelet.node_name, kubelet.images.busybox.ref
    cards = one_card(tmp_path / "dev")
    card, trigger, workdir = f"{tmp_path / 'dev'}/nvidia0", tmp_path / "trigger", tmp_path / "agent"
    trigger.mkdir()
    workdir.mkdir()
    agent = NodeAgentProcess(kubelet, control_plane.kubeconfig, cards, workdir, (
        "--lending", "--idle-after", IDLE_AFTER, "--checkpoint-deadline", str(DEADLINE_S),
        "--checkpoint-dir", str(tmp_path / "ckpt"), "--lease-namespace", "", "--isolation", "none"))
    agent.cli = dying(step)
    agent.start()
    try:
        # this agent's plugins registered (the node may still show an earlier case's agent's devices)
        wait_for(lambda: REGISTERED in agent.log_path.read_text(), timeout=AGENT_START_S,
                 what=f"the agent registered with kubelet\n{agent.log()}")
        wait_for(lambda: allocatable(core_v1, node) == CARD_MIB // 256 or None, timeout=60,
                 what=f"the card's devices on {node}\n{agent.log()}")
        core_v1.create_namespaced_pod(namespace, pod("owner", node, image, OWNER, {NAMES.assignment: assignment(
            node, OWNER_MIB)}, card, OWNER_MIB, None, str(trigger)))
        wait_for(lambda: running(core_v1, namespace, "owner"), timeout=90, what=f"the owner Running\n{agent.log()}")
        owner_id = container_id(core_v1, namespace, "owner")
        wait_for(lambda: lent(core_v1, node), timeout=60, what=f"card 0 lent\n{agent.log()}")
        notes = {NAMES.assignment: assignment(node, BORROWER_MIB), LEND.borrowed: "true",
                 LEND.borrowed_from: f"{namespace}/owner"}
        core_v1.create_namespaced_pod(namespace, pod("borrower", node, image, BORROWER, notes, card, BORROWER_MIB,
                                                     None, None))
        wait_for(lambda: running(core_v1, namespace, "borrower"), timeout=90,
                 what=f"the borrower Running on the loan\n{agent.log()}")
        borrower_id = container_id(core_v1, namespace, "borrower")
        wait_for(lambda: holders(agent, card) >= {owner_id, borrower_id} or None, timeout=30,
                 what=f"owner and borrower holding the card\n{agent.log()}")
        last_offer = lendable_updated(core_v1, node)
        assert last_offer is not None, agent.log()

        (trigger / "go-1").touch()  # the owner opens its card again: rule 1, the borrower is reclaimed
        assert agent.proc is not None
        assert agent.proc.wait(30) == -9, agent.log()  # SIGKILLed at the step, not ended some other way
        first_life = agent.log_path.read_text()
        journal = json.loads((workdir / JOURNAL_FILE).read_text())["reclaims"]
        assert [(r["pod"], r["step"]) for r in journal] == [("borrower", step)], journal
        if step != ReclaimStep.STOPPED.label:
            assert borrower_id in holders(agent, card) or running(core_v1, namespace, "borrower"), first_life

        agent.cli = list(GPUPOOL_CLI)  # the same agent, unchanged, on the same files
        agent.start()
        restarted = time.monotonic()
        offers: list[tuple[float, float]] = []  # (since the restart, the offer's "updated") while card 0 is listed
        withdrawn = False  # the restarted agent took the dead one's offer back
        while not (pod_gone(core_v1, namespace, "borrower") and borrower_id not in holders(agent, card)):
            assert time.monotonic() - restarted < AGENT_START_S + DEADLINE_S + 30, \
                f"the borrower still there\n{agent.log()}"
            offer = lendable_updated(core_v1, node)
            if offer is None:
                withdrawn = True
            else:
                offers.append((round(time.monotonic() - restarted, 2), offer))
            time.sleep(0.1)
        stopped_s = time.monotonic() - restarted
        # only the dead agent's offer, until the restarted one is up: never card 0 offered again beside the borrower
        assert all(updated == last_offer for _, updated in offers), offers
        assert withdrawn and lent(core_v1, node) is None, (offers, agent.log())
        reasons = [e.reason for e in core_v1.list_namespaced_event(namespace).items
                   if e.involved_object.name == "borrower"]
        assert RECLAIMED_REASON in reasons, reasons
        # the entry is dropped right after the eviction and its Event: wait for it, briefly
        wait_for(lambda: json.loads((workdir / JOURNAL_FILE).read_text())["reclaims"] == [] or None, timeout=15,
                 what=f"the reclaim journal emptied\n{agent.log()}")
        assert owner_id in holders(agent, card) and running(core_v1, namespace, "owner") is not None

        wait_for(lambda: (lendable_updated(core_v1, node) or 0) > last_offer, timeout=30,
                 what=f"card 0 lent again once its owner idles\n{agent.log()}")
        # the owner deleted: gone from kubelet's list at once, its processes hold the card a moment longer
        core_v1.delete_namespaced_pod("owner", namespace, grace_period_seconds=0)
        wait_for(lambda: not holders(agent, card) or None, timeout=30,
                 what=f"the owner's processes gone\n{agent.log()}")
        time.sleep(RISK_ROUND_S)
        second_life = agent.log_path.read_text()[len(first_life):]
        assert f"risk: {namespace}/owner" not in second_life, second_life
        assert agent.running(), agent.log()
        print(f"\n  [{step}] restart to borrower stopped and evicted: {stopped_s:.1f} s; "
              f"case {time.monotonic() - began:.1f} s")
    finally:
        for name in ("borrower", "owner"):
            with contextlib.suppress(client.ApiException):
                core_v1.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        # the next case's card is the same device numbers: its agent must not find these containers on it
        if agent.running():
            wait_for(lambda: not holders(agent, card) or None, timeout=30, what="the pods' containers gone")
        agent.stop()
