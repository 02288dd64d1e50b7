"""The recorder with rules plugged in after start: the decider, recorded priorities, open listeners."""

from __future__ import annotations

from pathlib import Path

from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind, Verdict
from gpupool.nodeagent.monitor.recorder import UsageRecorder
from gpupool.nodeagent.monitor.state_file import StateFile
from gpupool.nodeagent.monitor.usage_state import Holder, ProcessIdentity
from tests.nodeagent.monitor.fake_processes import FakeProcesses

GPU0 = "/dev/nvidia0"


def test_rules_plugged_in_after_registration_answer_and_hear_every_new_holder(tmp_path: Path) -> None:
    procs = FakeProcesses()
    procs.spawn(7, GPU0)
    named: dict[int, ProcessIdentity] = {7: ProcessIdentity("c7", "main", "pod-7", "ml")}
    recorder = UsageRecorder("n1", [GPU0], StateFile(tmp_path / "state.json"), procs,
                             identify=lambda pid: named.get(pid, ProcessIdentity()), ignore_pids=[9],
                             decide=lambda event: Verdict.DENY if event.pid == 6 else Verdict.ALLOW)
    registration = recorder.registration()  # what the source holds from before the rules exist
    heard: list[tuple[str, int, int | None, int]] = []

    def on_open(path: str, holder: Holder) -> None:  # reads the state: must not be under the lock
        heard.append((path, holder.pid, holder.priority, len(recorder.state.devices[0].holders)))

    asked: list[int] = []

    def rules(event: DeviceEvent) -> Verdict:
        asked.append(event.pid)
        return Verdict.DENY if event.pid == 7 else Verdict.ALLOW

    recorder.use_rules(rules, lambda who, path: 1 if who.pod else None, on_open)
    open_event = DeviceEvent(EventKind.OPEN, GPU0, 7, 1.0)
    assert registration.decide(open_event) is Verdict.DENY
    assert registration.decide(DeviceEvent(EventKind.OPEN, GPU0, 6, 1.0)) is Verdict.DENY  # the earlier decider
    assert registration.decide(DeviceEvent(EventKind.OPEN, GPU0, 5, 1.0)) is Verdict.ALLOW
    assert asked == [7, 5]
    assert registration.decide(DeviceEvent(EventKind.OPEN, GPU0, 9, 1.0)) is Verdict.ALLOW  # the agent itself
    registration.sink(open_event)
    assert heard == [(GPU0, 7, 1, 1)]
    assert recorder.state.devices[0].holders[0].priority == 1

    procs.spawn(8, GPU0)  # opened before its container was known: heard when it is named
    registration.sink(DeviceEvent(EventKind.OPEN, GPU0, 8, 2.0))
    assert heard[-1] == (GPU0, 8, None, 2)
    named[8] = ProcessIdentity("c8", "main", "pod-8", "ml")
    recorder.identify_again()
    assert heard[-1] == (GPU0, 8, 1, 2)
