"""The list+watch loop's back-off: bounded, growing only while failures last, and jittered."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from gpupool.kube.listwatch import Backoff, ListWatch
from gpupool.testing.fake_api import FakePodApi
from gpupool.testing.fake_watch import FakeListWatch


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.mark.parametrize(("backoff", "delays"), [
    pytest.param(Backoff(0.5, 4.0), [0.5, 1.0, 2.0, 4.0, 4.0], id="doubles-to-the-cap"),
    pytest.param(Backoff(1.0), [1.0, 1.0, 1.0], id="constant-without-a-cap"),
])
def test_backoff_grows_to_its_cap_and_starts_over_after_a_reset(backoff: Backoff, delays: list[float]) -> None:
    assert [backoff.next() for _ in delays] == delays
    backoff.reset()
    assert backoff.next() == delays[0]


def test_backoff_jitter_only_shortens_the_delay() -> None:
    backoff = Backoff(1.0, 8.0, jitter=0.5, rng=random.Random(7))
    got = [backoff.next() for _ in range(6)]
    nominal = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert all(n / 2 <= d <= n for d, n in zip(got, nominal, strict=True)), got
    assert len(set(got)) == len(got)  # spread: agents failing together retry apart


@pytest.mark.parametrize(("initial", "jitter"), [
    pytest.param(0.0, 0.0, id="zero-initial"),
    pytest.param(1.0, 1.0, id="jitter-could-make-it-zero"),
    pytest.param(1.0, -0.1, id="negative-jitter"),
])
def test_backoff_refuses_settings_that_would_spin(initial: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(initial, 10.0, jitter)


class RecordingBackoff(Backoff):
    """Remembers every delay it handed out."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        super().__init__(initial_s, max_s)
        self.delays: list[float] = []

    def next(self) -> float:
        delay = super().next()
        self.delays.append(delay)
        return delay


def test_list_watch_backs_off_longer_while_failing_and_short_again_once_it_works() -> None:
    api = FakePodApi()
    server = FakeListWatch(api, poll_s=0.01)
    server.fail_next_lists(500, times=3)
    server.fail_next_watch(503)  # and the first watch after the list that works
    listed: list[list[dict[str, Any]]] = []
    events: list[str] = []

    def on_list(items: Iterable[dict[str, Any]]) -> None:
        listed.append(list(items))

    stop = threading.Event()
    backoff = RecordingBackoff(0.01, 1.0)
    watch = ListWatch("pods", server.list_pod_for_all_namespaces, on_list, lambda kind, _: events.append(kind),
                      stop=stop, watch_timeout_s=1, backoff=backoff).start()
    try:
        eventually(lambda: len(listed) == 1 and watch.failures == 4)
        assert backoff.delays == [0.01, 0.02, 0.04, 0.01]  # the list worked: a new failure starts short
        api.create_pod({"metadata": {"name": "p1"}})
        eventually(lambda: events == ["ADDED"])  # through a watch that works
        server.hold_watches()
        server.fail_next_watch(503)
        api.create_pod({"metadata": {"name": "p2"}})
        server.release_watches()
        eventually(lambda: events == ["ADDED", "ADDED"])
        assert backoff.delays == [0.01, 0.02, 0.04, 0.01, 0.01]  # the watch had worked: short again
    finally:
        stop.set()
        server.hold_watches()
        server.release_watches()
        watch.thread.join(10)
