"""The real-kubelet lock of :mod:`tests.e2e.real_containers`: two pytest runs that overlap (the
compatibility set beside the end-to-end suite in ``scripts/test-all``) start their real kubelets one
after the other. Not an end-to-end test: it runs with the unit tests."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

import pytest

from tests.e2e.real_containers import REAL_KUBELET_LOCK_ENV, one_real_kubelet_at_a_time


def test_a_second_holder_waits_until_the_first_releases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock_path = tmp_path / "real-kubelet.lock"
    monkeypatch.setenv(REAL_KUBELET_LOCK_ENV, str(lock_path))
    entered = threading.Event()

    def second_run() -> None:
        with one_real_kubelet_at_a_time():
            entered.set()

    with open(lock_path, "a") as other_run:  # another run's kubelet holds the lock
        fcntl.flock(other_run, fcntl.LOCK_EX)
        waiter = threading.Thread(target=second_run, daemon=True)
        waiter.start()
        assert not entered.wait(0.5), "entered while another run held the lock"
    assert entered.wait(10), "never entered after the other run released the lock"
    waiter.join(10)


def test_without_the_variable_nothing_is_locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REAL_KUBELET_LOCK_ENV, raising=False)
    with one_real_kubelet_at_a_time():
        pass
    assert list(tmp_path.iterdir()) == []


def test_the_lock_is_released_when_the_kubelet_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock_path = tmp_path / "real-kubelet.lock"
    monkeypatch.setenv(REAL_KUBELET_LOCK_ENV, str(lock_path))
    with one_real_kubelet_at_a_time():
        pass
    with open(lock_path, "a") as after:
        fcntl.flock(after, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if still held
