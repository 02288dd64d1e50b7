"""The rule that keeps the watch authoritative over the pod cache's last-resort reads: a read is
handed on only when the watch neither holds the pod nor spoke of it while the read was in flight."""

from __future__ import annotations

from gpupool.nodeagent.pod_read_gate import PodReadGate

P9, P1 = ("default", "p9"), ("default", "p1")


def test_a_read_the_watch_said_nothing_about_is_handed_on_and_then_held() -> None:
    gate = PodReadGate()
    gate.listed([P1])
    ticket = gate.begin(P9)
    gate.said(P1, gone=True)  # another pod's event says nothing about p9
    assert gate.end(ticket) and gate.reads_in_flight() == 0
    gate.handed_on(P9)
    assert gate.holds(P9)
    assert not gate.end(gate.begin(P9))  # a second read of it: the store has it already


def test_a_pod_the_watch_holds_is_never_replaced_by_a_read() -> None:
    gate = PodReadGate()
    gate.said(P9, gone=False)
    assert not gate.end(gate.begin(P9))


def test_a_deletion_or_a_newer_version_during_the_read_drops_it() -> None:
    for gone in (True, False):
        gate = PodReadGate()
        ticket = gate.begin(P9)
        gate.said(P9, gone=gone)
        assert not gate.end(ticket)


def test_a_deletion_before_the_read_began_does_not_drop_it() -> None:
    """The read started after the watch's last word, so it is at least that new (a pod re-created
    under the old name)."""
    gate = PodReadGate()
    gate.said(P9, gone=False)
    gate.said(P9, gone=True)
    assert gate.end(gate.begin(P9))


def test_a_list_during_the_read_drops_every_read_in_flight() -> None:
    gate = PodReadGate()
    first, second = gate.begin(P9), gate.begin(P1)
    gate.listed([])
    assert not gate.end(first) and not gate.end(second)
    assert gate.end(gate.begin(P9))  # a read begun after the list is not spoken over
