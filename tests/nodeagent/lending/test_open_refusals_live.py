"""The lending rules refuse at open through the real kernel (seed 000, claims 1 and 7): real child
processes in real cgroup2 directories (one per container) open a stand-in card (``mknod`` of 1:5,
/dev/zero's number); the lending service decides, the cgroup-device gate refuses.

Case C: the owner holds its card (not lent), its borrower's open fails with ``EPERM`` (and it is
reclaimed, as rule 3 says) and the owner keeps running and opening. Case A: an owner returning to
its lent card is never refused; its borrower is, from then on. Skipped, with the probe's reason,
where device programs cannot load.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.nodeagent.containers.container_gate import ContainerGate
from gpupool.nodeagent.linux.cgroup2 import cgroup2_mount
from gpupool.nodeagent.linux.cgroup_device_gate import CgroupDeviceGate, cgroup_device_gate_available
from gpupool.nodeagent.monitor.usage_state import DeviceState
from tests.nodeagent.lending.support import decoded, holder
from tests.nodeagent.lending.world import PODS, World, run, settle
from tests.nodeagent.linux.test_cgroup_device_gate import Opener

AVAILABLE, WHY = cgroup_device_gate_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"cgroup-device gate unavailable: {WHY}")

_HOLD = "import os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\nprint('held', flush=True)\nsys.stdin.read()\n"


@pytest.fixture
def containers() -> Iterator[dict[str, str]]:
    """A fresh cgroup2 directory per container ID of the world's pods (removed afterwards)."""
    mount = cgroup2_mount()
    assert mount is not None
    made = {cid: os.path.join(mount, f"gpupool-test-{uuid.uuid4().hex[:10]}") for cid in ("id-owner", "id-borrower")}
    for path in made.values():
        os.mkdir(path)
    yield made
    for path in made.values():
        os.rmdir(path)


@pytest.fixture
def card(tmp_path: Path) -> str:
    path = tmp_path / "dev" / "nvidia0"
    path.parent.mkdir()
    os.mknod(path, 0o666 | 0o020000, os.makedev(1, 5))
    return str(path)


class Holder:
    """A process of a container holding the card open until :meth:`end`."""

    def __init__(self, cgroup: str, path: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()\n" + _HOLD, path],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        with open(os.path.join(cgroup, "cgroup.procs"), "w", encoding="ascii") as fh:
            fh.write(str(self.process.pid))
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "held"

    def running(self) -> bool:
        return self.process.poll() is None

    def end(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(10)


def world_on(tmp_path: Path, card: str) -> World:
    world = World(tmp_path, PODS)
    world.monitor.cards = {card: 0}
    return world


def test_case_c_the_borrowers_open_fails_with_eperm_and_the_owner_keeps_running(
        tmp_path: Path, card: str, containers: dict[str, str]) -> None:
    world = world_on(tmp_path, card)
    gate = ContainerGate(CgroupDeviceGate(), containers.get)
    owner = Holder(containers["id-owner"], card)
    asker, owner_again = Opener(containers["id-borrower"]), Opener(containers["id-owner"])

    async def body() -> None:
        service = world.started(gate=gate)
        world.monitor.hold(card, holder("owner", owner.process.pid))
        service.on_open(card, holder("owner", owner.process.pid))  # the monitor records the owner's open
        assert asker.open(card) == errno.EPERM
        assert owner.running() and owner_again.open(card) == 0
        await settle(service)
        assert world.api.evicted == [("ns", "borrower")], "the refused asker is reclaimed (rule 3)"
        world.pods.on_event("DELETED", *decoded(PODS[1]))
        world.monitor.hold(card)  # the owner let go of the card
        await service.step()
        assert asker.open(card) == 0

    try:
        run(body)
    finally:
        gate.close()
        owner.end()
        asker.end()
        owner_again.end()


def test_case_a_an_owner_returning_opens_at_once_and_its_borrower_is_refused(
        tmp_path: Path, card: str, containers: dict[str, str]) -> None:
    world = world_on(tmp_path, card)
    gate = ContainerGate(CgroupDeviceGate(), containers.get)
    borrower = Holder(containers["id-borrower"], card)
    owner, borrower_again = Opener(containers["id-owner"]), Opener(containers["id-borrower"])

    async def body() -> None:
        service = world.started(gate=gate)
        world.monitor.hold(card, holder("owner", 100), state=DeviceState.IDLE)
        world.monitor.sample({0: 2048})
        await service.step()
        assert service.loans, "the idle card is lent"
        world.processes.alive = {borrower.process.pid: "id-borrower"}
        world.monitor.hold(card, holder("owner", 100), holder("borrower", borrower.process.pid),
                           state=DeviceState.IDLE)
        await service.step()
        assert borrower_again.open(card) == 0, "on the loan, the borrower may open the card"
        assert owner.open(card) == 0
        service.on_open(card, holder("owner", 101))  # the owner is back: rule 1
        assert owner.open(card) == 0, "an owner is never refused"
        assert borrower_again.open(card) == errno.EPERM
        await settle(service)

    try:
        run(body)
    finally:
        gate.close()
        borrower.end()
        owner.end()
        borrower_again.end()
