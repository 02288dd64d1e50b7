"""Issue 28: a node agent SIGKILLed at each step of a reclaim finishes it after a restart.

The first life runs in a process of its own (:mod:`tests.nodeagent.lending.restart_driver`) that
kills itself with SIGKILL right after the reclaim journal wrote the step; the borrower is two real
processes (``examples/checkpoint_worker.sh``: one follows the checkpoint protocol, one ignores the
signal). The second life is a fresh service on the same files. Each time: the borrower ends
stopped, card 0 is never offered while its owner is active, the owner is never signalled and its
hold is not a risk, and the card is lent again only once the owner is idle again.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.api.lending import decode_lendable
from gpupool.files.replace import TEMP_SUFFIX
from gpupool.nodeagent.lending.reclaim_journal import JOURNAL_FILE, ReclaimStep
from gpupool.nodeagent.monitor.usage_state import DeviceState
from gpupool.nodeagent.pod_view import pod_view_from_json
from gpupool.nodeagent.risk.detector import NodeView, detect, grants_of
from tests.nodeagent.lending.restart_driver import DONE, PidProcesses, alive
from tests.nodeagent.lending.support import NAMES, decoded, holder
from tests.nodeagent.lending.world import CARD0, PODS, World, run, settle

# Slow, so scripts/test-all runs it and a plain pytest does not: each case kills and restarts an agent mid-reclaim
# with real processes.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
WORKER = str(ROOT / "examples" / "checkpoint_worker.sh")


def borrower(directory: Path, ignore: bool) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GPUPOOL_CHECKPOINT_DIR": str(directory), "STEP_SECONDS": "0.1",
           **({"IGNORE_CHECKPOINT": "1"} if ignore else {})}
    proc = subprocess.Popen(["sh", WORKER], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None and proc.stdout.readline().startswith(b"started")
    return proc


def offered(world: World) -> set[int]:
    """The cards the last publication offered."""
    last = world.api.annotations[-1] if world.api.annotations else None
    return {c.index for c in decode_lendable(last).cards} if last else set()


def owner_risks(world: World) -> list[str]:
    views = [pod_view_from_json(p, NAMES) for p in PODS]
    view = NodeView(world.monitor.cards, world.monitor.state, world.monitor.last_sample, grants_of("n1", views),
                    True, None, 1000.0)
    return [r.detail for r in detect(view, 10.0) if r.pod == "owner"]


@pytest.mark.parametrize("step", [*(s.label for s in ReclaimStep), DONE])
def test_an_agent_killed_mid_reclaim_finishes_it_after_a_restart(tmp_path: Path, step: str) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    procs = [borrower(ckpt, ignore=False), borrower(ckpt, ignore=True)]
    pids = [p.pid for p in procs]
    try:
        first = subprocess.run([sys.executable, "-m", "tests.nodeagent.lending.restart_driver", str(tmp_path), step,
                                *map(str, pids)], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert first.returncode == -9, first.stderr  # SIGKILLed at the step, not ended some other way
        journal = json.loads((tmp_path / JOURNAL_FILE).read_text())["reclaims"]
        assert [r["step"] for r in journal] == ([] if step == DONE else [step])

        world = World(tmp_path, PODS)
        processes = PidProcesses(pids)
        world.processes = processes  # type: ignore[assignment]
        holders = [holder("owner", 100), holder("owner", 101)]
        if any(alive(p) for p in pids):
            holders.append(holder("borrower", 200))
        # mid-reclaim the state file may still say idle (the harshest case); after it, the owner's open made it busy
        world.monitor.hold(CARD0, *holders, state=DeviceState.BUSY if step == DONE else DeviceState.IDLE)
        world.monitor.sample({0: 2048, 1: 2048})

        async def second_life() -> None:
            service = world.started()
            assert service.loans == {}  # the loan the owner ended is not resumed, even where lending.json kept it
            for _ in range(40):
                await service.step()
                assert 0 not in offered(world) and 0 not in service.loans
                if not service.reclaimer.in_flight and not service.journal.records():
                    break
                await asyncio.sleep(0.1)
            await settle(service)
            assert not any(alive(p) for p in pids), "the borrower still runs beside its owner"
            assert service.journal.records() == [] and not json.loads((tmp_path / JOURNAL_FILE).read_text())["reclaims"]
            sent = [sig for _, sig in processes.sent]
            if step != ReclaimStep.RECORDED.label:
                assert "SIGUSR1" not in sent  # signalled once, by the first life
            if step in (ReclaimStep.EVICTED.label, DONE):
                assert world.api.evicted == []  # not evicted twice
            else:
                assert world.api.evicted == [("ns", "borrower")]
            if step != DONE:  # a stale idle state: the owner was not yet seen in use since its return
                world.monitor.hold(CARD0, holder("owner", 100), holder("owner", 101), state=DeviceState.IDLE)
                await service.step()
                assert 0 not in service.loans
            assert owner_risks(world) == []
            world.monitor.hold(CARD0, holder("owner", 100), holder("owner", 101), state=DeviceState.BUSY)
            await service.step()
            assert service.loans == {}
            world.monitor.hold(CARD0, holder("owner", 100), holder("owner", 101), state=DeviceState.IDLE)
            await service.step()  # idle again by the usual rules: lent again
            assert set(service.loans) == {0}

        run(second_life)
        assert procs[0].wait(5) == 0 and list(ckpt.glob("ckpt-*"))  # the protocol's worker checkpointed
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)


@pytest.mark.parametrize("content", [
    pytest.param('{"version": 1, "reclaims": [{"namespace": "ns", "pod": "borr', id="partial"),
    pytest.param('{"version": 1, "reclaims": [{"namespace": "ns", "pod": "borrower"}]}', id="record-missing-fields"),
    pytest.param('{"version": 7, "reclaims": []}', id="unknown-version"),
    pytest.param("\x00\x01garbage", id="garbage"),
])
def test_an_unreadable_journal_is_logged_resumes_no_loan_and_stops_a_borrower_left_beside_its_owner(
        tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture) -> None:
    world = World(tmp_path, PODS)
    world.processes.alive = {200: "id-borrower"}

    async def body() -> None:
        first = world.started()
        world.monitor.hold(CARD0, holder("owner", 100), state=DeviceState.IDLE)
        world.monitor.sample({0: 2048, 1: 2048})
        await first.step()
        assert set(first.loans) == {0}
        (tmp_path / JOURNAL_FILE).write_text(content)  # what a broken disk or a hand edit leaves
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
        again = world.started()  # never raises
        assert again.loans == {}
        await again.step()  # the pods are known: the borrower beside its owner on a card not lent is stopped
        await settle(again)
        assert world.api.evicted == [("ns", "borrower")] and 200 not in world.processes.alive
        assert again.loans == {}  # the card is held back until its owner was seen in use and idle again
        world.monitor.hold(CARD0, holder("owner", 100), state=DeviceState.BUSY)
        await again.step()
        world.monitor.hold(CARD0, holder("owner", 100), state=DeviceState.IDLE)
        await again.step()
        assert set(again.loans) == {0}

    run(body)
    assert any("reclaim journal" in r.getMessage() and "unreadable" in r.getMessage() and r.levelname == "ERROR"
               for r in caplog.records), caplog.text


def test_the_journal_is_written_before_the_borrower_is_signalled_and_emptied_once_the_pod_left(
        tmp_path: Path) -> None:
    world = World(tmp_path, PODS)
    seen: list[list[str]] = []

    class Watching(type(world.processes)):  # type: ignore[misc]
        def send(self, pid: int, sig: object) -> None:
            seen.append([r["step"] for r in json.loads((tmp_path / JOURNAL_FILE).read_text())["reclaims"]])
            super().send(pid, sig)

    world.processes = Watching()
    world.processes.alive = {200: "id-borrower"}

    async def body() -> None:
        service = world.started()
        world.monitor.hold(CARD0, holder("owner", 100))  # busy: not lent
        service.on_open(CARD0, holder("borrower", 200))
        assert [r.step for r in service.journal.records()] == [ReclaimStep.RECORDED]  # on the deciding thread
        await settle(service)
        assert world.api.evicted == [("ns", "borrower")]
        done = json.loads((tmp_path / JOURNAL_FILE).read_text())
        assert done == {"version": 1, "reclaims": [],
                        "reclaimed": [{"namespace": "ns", "pod": "borrower", "uid": "uid-borrower"}]}
        world.pods.on_event("DELETED", *decoded(PODS[1]))  # the eviction landed: the pod left the node
        await service.step()

    run(body)
    assert seen == [["recorded"]]
    assert json.loads((tmp_path / JOURNAL_FILE).read_text()) == {"version": 1, "reclaims": [], "reclaimed": []}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(TEMP_SUFFIX)]  # no temporary file left
