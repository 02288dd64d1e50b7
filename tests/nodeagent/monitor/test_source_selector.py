"""The selector: fanotify where it reports opens of the watched files, else the /proc scan."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest

from gpupool.nodeagent.monitor.events import EventKind, Registration
from gpupool.nodeagent.monitor.source_selector import choose_source, probe_fanotify
from tests.nodeagent.monitor.children import CollectingSink, HoldingChild, stand_in


def _never(paths: Sequence[str]) -> str | None:
    return "no fanotify in this test"


def _always(paths: Sequence[str]) -> str | None:
    return None


@pytest.mark.parametrize("probe, expected", [
    pytest.param(_always, "fanotify", id="probe-sees-opens"),
    pytest.param(_never, "proc-scan", id="probe-sees-nothing"),
])
def test_the_probe_decides(tmp_path: os.PathLike[str], probe: object, expected: str) -> None:
    choice = choose_source([stand_in(str(tmp_path), "nvidia0")], probe=probe)  # type: ignore[arg-type]
    assert choice.source.name == expected
    assert choice.reason


def test_no_device_file_at_all_falls_back_to_the_scan_and_says_why(tmp_path: os.PathLike[str]) -> None:
    choice = choose_source([os.path.join(str(tmp_path), "nvidia0")], probe=_always)
    assert choice.source.name == "proc-scan"
    assert "none of the watched device files exists" in choice.reason


def test_on_a_regular_file_the_real_probe_picks_fanotify_when_root(tmp_path: os.PathLike[str]) -> None:
    path = stand_in(str(tmp_path), "nvidia0")
    why_not = probe_fanotify([path])
    if why_not is not None:
        pytest.skip(f"fanotify not usable here: {why_not}")
    assert choose_source([path]).source.name == "fanotify"


@pytest.mark.slow
def test_the_source_chosen_for_a_character_device_reports_a_childs_open() -> None:
    """Whatever this kernel does for character devices, the selector's choice must see the open
    (kernel 6.18 reports nothing through fanotify, so there it is the scan)."""
    choice = choose_source(["/dev/null"], scan_interval=0.05)
    sink = CollectingSink()
    choice.source.register(Registration(sink))
    choice.source.start()
    try:
        with HoldingChild("/dev/null") as child:
            sink.wait_for(EventKind.OPEN, "/dev/null", child.pid)
    finally:
        choice.source.stop()
