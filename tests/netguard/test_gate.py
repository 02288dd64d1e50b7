"""The gate's decisions with a hand-driven clock and hand-counted loop turns: the cap, who is
evicted, who is refused."""

from __future__ import annotations

import pytest

from gpupool.netguard.gate import PROTECTED_S, PROTECTED_TURNS, ConnectionGate
from gpupool.netguard.limits import ServerLimits


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_past_the_cap_the_oldest_silent_connection_makes_room() -> None:
    clock, closed, events = Clock(), [], []
    gate = ConnectionGate(3, clock, notify=events.append)
    places = [gate.admit(lambda i=i: closed.append(i)) for i in range(3)]
    assert all(places) and gate.open == 3
    clock.now += 2 * PROTECTED_S
    newcomer = gate.admit(lambda: closed.append(3))
    assert newcomer is not None
    assert closed == [0] and gate.open == 3 and events == ["evicted"]
    assert places[0] is not None and places[0].released
    gate.release(places[0])  # its transport reports the close later: counted once
    assert gate.open == 3


def test_a_connection_that_spoke_is_never_evicted_and_a_full_port_of_them_refuses() -> None:
    clock, closed, events = Clock(), [], []
    gate = ConnectionGate(2, clock, notify=events.append)
    first, second = gate.admit(lambda: closed.append(1)), gate.admit(lambda: closed.append(2))
    assert first is not None and second is not None
    gate.activate(first)
    clock.now += 10
    third = gate.admit(lambda: None)  # the silent second makes room
    assert third is not None and closed == [2]
    gate.activate(third)
    assert gate.admit(lambda: None) is None  # every place is active: refused
    assert gate.counts.refused == 1 and events == ["evicted", "refused"]


def test_a_burst_within_a_few_turns_cannot_push_out_a_client_accepted_just_before() -> None:
    """Its bytes are read a few turns after its accept: until then the newcomers are refused."""
    clock, closed = Clock(), []
    gate = ConnectionGate(2, clock)
    assert gate.admit(lambda: closed.append("old"))
    clock.now += 10
    gate.tick()
    assert gate.admit(lambda: closed.append("client"))
    for _ in range(PROTECTED_TURNS - 1):
        gate.tick()
    assert gate.admit(lambda: None) is not None  # the old one goes
    assert gate.admit(lambda: None) is None  # the client is still protected
    gate.tick()
    assert gate.admit(lambda: None) is not None
    assert closed == ["old", "client"]


def test_an_attacker_reconnecting_at_once_still_leaves_room() -> None:
    """Every dropped connection opened again at once: past the protection the newcomer evicts."""
    clock = Clock()
    gate = ConnectionGate(4, clock)
    for _ in range(4):
        assert gate.admit(lambda: None)
    for _ in range(PROTECTED_TURNS):
        gate.tick()
    for _ in range(4):  # the attacker's next round takes the places of its previous one
        assert gate.admit(lambda: None)
    for _ in range(PROTECTED_TURNS):
        gate.tick()
    assert gate.admit(lambda: None) is not None  # a real client
    assert gate.counts.refused == 0


def test_a_timed_out_connection_is_released_once_and_closed() -> None:
    gate, closed = ConnectionGate(1), []
    place = gate.admit(lambda: closed.append("x"))
    assert place is not None
    gate.time_out(place)
    gate.time_out(place)
    gate.release(place)
    assert closed == ["x"] and gate.open == 0 and gate.counts.timed_out == 1


def test_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ServerLimits(max_connections=0)
    with pytest.raises(ValueError, match="header timeout"):
        ServerLimits(header_timeout_s=0)
