"""Which backend a node gets, and what the cgroup root says about the kernel's dmem controller."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli.main import cli
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.isolation.backends import (
    IsolationBackend,
    IsolationConfigError,
    NoEnforcement,
    choose_backend,
    enforcement_notice,
)
from gpupool.nodeagent.isolation.dmem import detect_dmem, parse_capacity
from gpupool.nodeagent.isolation.dmem_backend import DmemEnforcement
from gpupool.nodeagent.isolation.mps_backend import MpsEnforcement
from gpupool.nodeagent.isolation.setup import IsolationConfig, build_enforcement
from gpupool.nodeagent.isolation.shim_backend import ShimEnforcement
from tests.nodeagent.isolation.dmem_tree import NVIDIA_BUS_ID, NVIDIA_REGION
from tests.nodeagent.isolation.dmem_tree import cgroup_root as dmem_root


@pytest.mark.parametrize(("requested", "library", "backend"), [
    pytest.param("auto", "/lib/shim.so", IsolationBackend.SHIM, id="auto-with-library"),
    pytest.param("auto", None, IsolationBackend.NONE, id="auto-without-library"),
    pytest.param("shim", "/lib/shim.so", IsolationBackend.SHIM, id="shim"),
    pytest.param("mps", None, IsolationBackend.MPS, id="mps-only-when-asked"),
    pytest.param("none", "/lib/shim.so", IsolationBackend.NONE, id="none-wins-over-a-library"),
])
def test_choice(requested: str, library: str | None, backend: IsolationBackend) -> None:
    assert choose_backend(requested, library).backend is backend


def test_auto_enforces_with_the_packaged_library_when_none_is_given() -> None:
    """The image ships the library where ``packaged_library`` finds it: enforcement on by default."""
    choice = choose_backend("auto", None, "/pkg/libgpupool-shim.so")
    assert (choice.backend, choice.library, choice.shares) == (IsolationBackend.SHIM, "/pkg/libgpupool-shim.so", True)
    given = choose_backend("auto", "/lib/shim.so", "/pkg/libgpupool-shim.so")
    assert given.library == "/lib/shim.so"  # --shim-library wins over the packaged one
    assert choose_backend("shim", None, "/pkg/libgpupool-shim.so").library == "/pkg/libgpupool-shim.so"


def test_shares_are_advertised_unenforced_only_by_the_admins_explicit_choice() -> None:
    nothing = choose_backend("auto", None, None)
    assert nothing.backend is IsolationBackend.NONE and not nothing.shares
    assert "whole cards only" in nothing.reason and "--isolation none" in nothing.reason
    explicit = choose_backend("none", None, "/pkg/libgpupool-shim.so")
    assert explicit.backend is IsolationBackend.NONE and explicit.shares
    assert all(choose_backend(r, "/lib/shim.so").shares for r in ("auto", "shim", "mps"))


@pytest.mark.parametrize("requested", ["auto", "shim"])
def test_a_library_the_loader_cannot_load_leaves_whole_cards_only(requested: str) -> None:
    """It enforces nothing (the loader skips it), so the node is one without enforcement."""
    choice = choose_backend(requested, "/lib/shim.so", None, unloadable="wrong ELF class: ELFCLASS32")
    assert (choice.backend, choice.shares) == (IsolationBackend.NONE, False)
    assert "/lib/shim.so cannot be loaded (wrong ELF class: ELFCLASS32)" in choice.reason
    assert "whole cards only" in choice.reason
    notice = enforcement_notice(choice, NoEnforcement(choice.reason))
    assert (notice.enforcing, notice.shares) == (False, False)
    packaged = IsolationConfig("auto", packaged="/pkg/libgpupool-shim.so", library_problem="undefined symbol").choice()
    assert (packaged.backend, packaged.shares) == (IsolationBackend.NONE, False)


def test_the_load_verdict_changes_nothing_the_admin_chose_without_the_library() -> None:
    explicit = choose_backend("none", "/lib/shim.so", None, unloadable="wrong ELF class")
    assert (explicit.backend, explicit.shares) == (IsolationBackend.NONE, True)
    assert choose_backend("mps", "/lib/shim.so", None, unloadable="wrong ELF class").backend is IsolationBackend.MPS


def test_the_notice_says_what_the_node_publishes() -> None:
    nothing = choose_backend("auto", None, None)
    notice = enforcement_notice(nothing, NoEnforcement(nothing.reason))
    assert (notice.backend, notice.enforcing, notice.shares) == ("none", False, False)
    assert "whole cards only" in notice.shown()
    explicit = choose_backend("none", None, None)
    assert "NOT enforced" in enforcement_notice(explicit, NoEnforcement(explicit.reason)).shown()


@pytest.mark.parametrize(("requested", "library", "message"), [
    pytest.param("shim", None, "--isolation shim needs --shim-library", id="shim-without-library"),
    pytest.param("vgpu", None, "expected one of auto, shim, mps, none", id="unknown"),
])
def test_impossible_choices_are_errors(requested: str, library: str | None, message: str) -> None:
    with pytest.raises(IsolationConfigError, match=message):
        choose_backend(requested, library)


def test_the_command_refuses_shim_without_a_library_before_starting() -> None:
    result = CliRunner().invoke(cli, ["node-agent", "--isolation", "shim"])
    assert result.exit_code == 2, result.output
    assert "--isolation shim needs --shim-library" in result.output


def test_help_names_the_isolation_options() -> None:
    result = CliRunner().invoke(cli, ["node-agent", "--help"])
    for option in ("--isolation", "--shim-library", "--compute-mode", "--state-dir", "--mps-control", "--cgroup-root"):
        assert option in result.output


def test_build_enforcement(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    library = tmp_path / "lib.so"
    library.write_bytes(b"\x7fELF")
    directory = InMemoryContainerDirectory()
    root = str(tmp_path / "no-cgroup")
    shim = build_enforcement(IsolationConfig("auto", str(library), str(tmp_path / "s"), cgroup_root=root), directory)
    assert isinstance(shim, ShimEnforcement) and shim.state().enforcing
    mps = build_enforcement(IsolationConfig("mps", None, str(tmp_path / "m"), cgroup_root=root), directory)
    assert isinstance(mps, MpsEnforcement) and "no cgroup v2" in mps.dmem.reason
    with caplog.at_level("WARNING"):
        none = build_enforcement(IsolationConfig("auto", None, str(tmp_path / "n"), cgroup_root=root), directory)
    assert not none.state().enforcing
    assert "no GPU shares on this node, whole cards only" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        chosen = build_enforcement(IsolationConfig("none", None, str(tmp_path / "n"), cgroup_root=root), directory)
    assert "shares are NOT enforced on this node (--isolation none)" in caplog.text
    assert "admin's choice" in chosen.state().detail
    assert not (tmp_path / "n").exists()  # nothing is written for a node without enforcement


def test_build_enforcement_adds_dmem_limits_where_the_kernel_has_the_controller(tmp_path: Path) -> None:
    (tmp_path / "cgroup").mkdir()
    root = str(dmem_root(tmp_path / "cgroup"))
    directory = InMemoryContainerDirectory()
    mps = build_enforcement(IsolationConfig("mps", None, str(tmp_path / "m"), cgroup_root=root), directory,
                            {0: NVIDIA_BUS_ID, 1: ""})
    assert isinstance(mps, DmemEnforcement) and isinstance(mps.inner, MpsEnforcement)
    assert mps.limiter.regions[0].region == NVIDIA_REGION and not mps.limiter.regions[1].region
    none = build_enforcement(IsolationConfig("none", None, str(tmp_path / "n"), cgroup_root=root), directory,
                             {0: NVIDIA_BUS_ID})
    assert isinstance(none, NoEnforcement)  # "none" writes nothing, dmem or not


def cgroup_root(tmp_path: Path, controllers: str | None, capacity: str | None) -> str:
    if controllers is not None:
        (tmp_path / "cgroup.controllers").write_text(controllers + "\n")
    if capacity is not None:
        (tmp_path / "dmem.capacity").write_text(capacity)
    return str(tmp_path)


@pytest.mark.parametrize(("controllers", "capacity", "usable", "reason"), [
    pytest.param(None, None, False, "no cgroup v2", id="cgroup-v1-or-hybrid"),
    pytest.param("cpu io memory pids", None, False, "no dmem controller", id="kernel-without-dmem"),
    pytest.param("cpu memory dmem", None, False, "dmem.capacity unreadable", id="no-capacity-file"),
    pytest.param("cpu memory dmem", "drm/0000:03:00.0/vram0 8573157376\n", False,
                 "no NVIDIA region in dmem.capacity (regions: drm/0000:03:00.0/vram0)", id="only-another-driver"),
    pytest.param("cpu memory dmem", "nvidia/0000:17:00.0/vidmem 150754820096\n"
                                    "nvidia/0000:3d:00.0/vidmem 150754820096\n", True, "2 NVIDIA regions",
                 id="nvidia-regions"),
])
def test_dmem_detection(tmp_path: Path, controllers: str | None, capacity: str | None, usable: bool,
                        reason: str) -> None:
    status = detect_dmem(cgroup_root(tmp_path, controllers, capacity))
    assert status.usable is usable
    assert reason in status.reason


def test_capacity_lines_that_are_not_regions_are_skipped() -> None:
    regions = parse_capacity("nvidia/0000:17:00.0/vidmem 1024\ngarbage\nname notanumber\n")
    assert [(r.name, r.capacity_bytes) for r in regions] == [("nvidia/0000:17:00.0/vidmem", 1024)]


def test_this_machine_is_detected_without_error() -> None:
    status = detect_dmem()
    assert status.reason  # whatever the kernel here offers, the answer says why
