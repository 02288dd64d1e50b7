"""The retention sweep of task checkpoint directories (``--checkpoint-retention``,
gpupool/nodeagent/lending/checkpoint_retention.py) on a real directory tree: what goes, what stays
whatever its age, links, a refused root, and two agents sweeping one shared root at once."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Collection
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli import node_agent_cmd
from gpupool.cli.main import cli
from gpupool.nodeagent.lending import checkpoint as checkpoint_module
from gpupool.nodeagent.lending.checkpoint import CheckpointStore, namespace_dir_name, task_dir_name
from gpupool.nodeagent.lending.checkpoint_retention import TRASH_PREFIX, CheckpointRetention, Sweep, remove_tree
from gpupool.nodeagent.lending.options import LendingOptions, parse_retention
from gpupool.nodeagent.lending.pods import LendingPods
from gpupool.nodeagent.lending.setup import LoanedCapacity, task_dirs_in_use
from gpupool.nodeagent.options import AgentOptions
from tests.nodeagent.lending.support import LEND, decoded, inventory, pod_json

DAY = 86400.0
WEEK = 7 * DAY


def aged(path: Path, age_s: float) -> None:
    """Set ``path``'s modification time (and every entry's below it) ``age_s`` into the past."""
    when = time.time() - age_s
    for inner in sorted(path.rglob("*"), reverse=True) if path.is_dir() and not path.is_symlink() else []:
        os.utime(inner, (when, when), follow_symlinks=False)
    os.utime(path, (when, when), follow_symlinks=False)


def task(store: CheckpointStore, namespace: str, key: str, age_s: float, files: int = 2) -> Path:
    """A task directory as pods leave it: a dump and a checkpoint file, last changed ``age_s`` ago."""
    path = Path(store.directory(namespace, key))
    dump = path / "criu-1"
    dump.mkdir()
    for i in range(files):
        (dump / f"pages-{i}.img").write_bytes(b"p" * 1024)
    (path / "ckpt-3").write_text("3\n")
    aged(path, age_s)
    return path


def in_use_of(*pairs: tuple[str, str]) -> set[tuple[str, str]]:
    return {(namespace_dir_name(ns), task_dir_name(key)) for ns, key in pairs}


def retention(store: CheckpointStore, in_use: Collection[tuple[str, str]] | None = (),
              retention_s: float = WEEK) -> CheckpointRetention:
    return CheckpointRetention(store, retention_s, lambda: in_use)


def test_an_idle_task_goes_a_recent_one_stays_and_an_emptied_namespace_goes(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "root"))
    old = task(store, "team-a", "job-1", WEEK + DAY)
    recent = task(store, "team-b", "job-2", WEEK - DAY)
    older_beside_recent = task(store, "team-b", "job-3", 30 * DAY)
    done = retention(store).sweep()
    assert done is not None and sorted(done.removed) == sorted(
        ["team-a/" + old.name, "team-a", "team-b/" + older_beside_recent.name])
    assert not old.parent.exists() and not older_beside_recent.exists()
    assert (recent / "criu-1" / "pages-0.img").exists() and done.failed == 0
    assert sorted(os.listdir(recent.parent)) == [recent.name]  # nothing left aside


def test_a_task_a_pod_here_has_is_kept_whatever_its_age_and_marked_live(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "root"))
    mounted = task(store, "team-a", "job-1", 90 * DAY)
    reclaimed = task(store, "team-a", "ns-less-pod", 90 * DAY)
    in_use = in_use_of(("team-a", "job-1"), ("team-a", "ns-less-pod"))
    later = CheckpointRetention(store, WEEK, lambda: in_use, clock=lambda: time.time() + 90 * DAY)
    done = later.sweep()  # 90 days on: even just touched, both look idle; in use, they stay
    assert done is not None and done.removed == [] and done.kept_in_use == 2
    assert (mounted / "ckpt-3").exists() and (reclaimed / "ckpt-3").exists()
    assert time.time() - mounted.stat().st_mtime < 60  # other agents sharing the root see it live
    done = retention(store, in_use).sweep()
    assert done is not None and done.removed == [] and done.kept_in_use == 0  # touched: not old at all


def test_a_task_that_becomes_in_use_during_the_sweep_is_kept(tmp_path: Path) -> None:
    """The set is asked again under the store's lock, right before the move aside."""
    store = CheckpointStore(str(tmp_path / "root"))
    path = task(store, "team-a", "job-1", 90 * DAY)
    answers = iter([set(), in_use_of(("team-a", "job-1"))])
    done = CheckpointRetention(store, WEEK, lambda: next(answers, set())).sweep()
    assert done is not None and done.kept_in_use == 1 and (path / "ckpt-3").exists()


def test_a_write_deep_inside_an_old_looking_task_keeps_it(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "root"))
    path = task(store, "team-a", "job-1", 90 * DAY)
    deep = path / "criu-1" / "more"
    deep.mkdir()
    (deep / "now").write_text("x")
    os.utime(deep, (time.time() - 90 * DAY,) * 2)
    aged(path / "criu-1", 90 * DAY)
    aged(path, 90 * DAY)
    os.utime(deep / "now")  # written just now, below two old directories
    done = retention(store).sweep()
    assert done is not None and done.removed == [] and (deep / "now").exists()
    assert sorted(os.listdir(path.parent)) == [path.name]


def test_links_are_never_followed_out_of_the_root(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "precious").write_text("keep")
    aged(outside, 90 * DAY)
    store = CheckpointStore(str(tmp_path / "root"))
    path = task(store, "team-a", "job-1", 0)
    (path / "escape").symlink_to(outside)
    (path / "criu-1" / "file-escape").symlink_to(outside / "deep" / "precious")
    aged(path, 90 * DAY)
    namespace = Path(store.root) / "linked-ns"
    namespace.symlink_to(outside)  # a namespace that is a link: not entered
    (path.parent / "linked-task").symlink_to(outside)  # a task that is a link: not entered, not removed
    done = retention(store).sweep()
    assert done is not None and done.removed == ["team-a/" + path.name]
    assert (outside / "deep" / "precious").read_text() == "keep"
    assert namespace.is_symlink() and (path.parent / "linked-task").is_symlink()


@pytest.mark.parametrize("root", ["/", "file", "link-to-slash"])
def test_a_root_that_is_slash_or_no_directory_is_refused(tmp_path: Path, root: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "link-to-slash").symlink_to("/")
    store = CheckpointStore(root if root == "/" else str(tmp_path / root))
    sweep = retention(store)
    assert sweep.sweep() is None and sweep.sweep() is None
    assert len([r for r in caplog.records if "nothing is removed from it" in r.message]) == 1  # said once


def test_nothing_happens_before_the_pods_are_listed_or_with_retention_0(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "root"))
    path = task(store, "team-a", "job-1", 90 * DAY)
    assert retention(store, None).sweep() is None
    done = retention(store, retention_s=0).sweep()
    assert done is not None and done.removed == [] and (path / "ckpt-3").exists()


def test_what_a_remover_left_aside_is_removed_by_the_next_sweep(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "root"))
    path = task(store, "team-a", "job-1", 0)
    left = path.parent / f"{TRASH_PREFIX}{path.name}-deadbeef"
    path.rename(left)
    task(store, "team-a", "job-1", 0)
    done = retention(store).sweep()
    assert done is not None and not left.exists() and path.exists()


def test_two_agents_sweeping_one_shared_root_at_once(tmp_path: Path) -> None:
    """Each agent has its own store (its own lock), as two nodes on one NFS share: every idle task
    goes once, no sweep fails, nothing is left aside, the live task stays."""
    root = str(tmp_path / "root")
    writer = CheckpointStore(root)
    for n in range(40):
        task(writer, f"team-{n % 4}", f"job-{n}", 90 * DAY, files=5)
    live = task(writer, "team-0", "live", 0)
    sweeps = [retention(CheckpointStore(root)) for _ in range(2)]
    start = threading.Barrier(2)
    results: list[Sweep | None] = []

    def sweep(one: CheckpointRetention) -> None:
        start.wait()
        results.append(one.sweep())

    threads = [threading.Thread(target=sweep, args=(one,)) for one in sweeps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    done = [r for r in results if r is not None]
    assert len(done) == 2 and all(d.failed == 0 for d in done)
    removed = [name for d in done for name in d.removed if "/" in name]
    assert len(removed) == 40 == len(set(removed))
    assert sorted(os.listdir(root)) == ["team-0"] and os.listdir(live.parent) == [live.name]


def test_a_grant_marks_its_task_live_and_survives_a_namespace_removed_under_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another node's sweep may remove the namespace directory between its creation and the task's."""
    store = CheckpointStore(str(tmp_path / "root"))
    path = task(store, "team-a", "job-1", 90 * DAY)
    assert Path(store.directory("team-a", "job-1")).stat().st_mtime > time.time() - 60
    own_dir, raced = checkpoint_module._own_dir, list[str]()

    def racing(where: str, mode: int) -> None:
        if mode == checkpoint_module.TASK_MODE and not raced:
            raced.append(where)
            root = os.open(os.path.dirname(os.path.dirname(where)), os.O_RDONLY)
            try:
                remove_tree(root, os.path.basename(os.path.dirname(where)))
            finally:
                os.close(root)
        own_dir(where, mode)

    monkeypatch.setattr(checkpoint_module, "_own_dir", racing)
    assert store.directory("team-a", "job-1") == str(path) and raced and path.is_dir()


def test_the_loop_sweeps_every_interval(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "root"))
    path = task(store, "team-a", "job-1", 90 * DAY)
    sweep = CheckpointRetention(store, WEEK, lambda: set(), every_s=0.05)

    async def briefly() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await sweep.run()

    asyncio.run(briefly())
    assert not path.exists()


@pytest.mark.parametrize(("said", "seconds"), [("7d", WEEK), ("12h", 43200.0), ("1d12h", 1.5 * DAY), ("0", 0.0),
                                               ("90", 90.0), ("30m", 1800.0), (" 2d ", 2 * DAY)])
def test_retention_durations(said: str, seconds: float) -> None:
    assert parse_retention(said) == seconds


@pytest.mark.parametrize("said", ["", "7x", "-1", "d", "nan", "1w"])
def test_bad_retention_durations(said: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_retention(said)


def test_the_directories_in_use_are_this_nodes_pods_and_its_reclaims() -> None:
    pods = LendingPods(LEND)
    assert task_dirs_in_use(pods, ()) is None  # before the first full list a pod may merely be unknown
    pods.on_list(decoded(pod_json("a", owner_uid="job-uid"), pod_json("b", annotations={LEND.checkpoint_key: "k"}),
                         pod_json("c", namespace="Odd_NS")))
    found = task_dirs_in_use(pods, [("ns", "b"), ("ns", "gone")])
    assert found == in_use_of(("ns", "job-uid"), ("ns", "k"), ("Odd_NS", "Odd_NS/c"), ("ns", "ns/gone"))


def test_the_lending_part_runs_the_sweep_beside_its_loop() -> None:
    ran: list[str] = []

    class Service:
        def __init__(self) -> None:
            self.loans: dict[int, object] = {}

        async def run(self) -> None:
            ran.append("loop")
            await asyncio.sleep(3600)

    class Sweep:
        async def run(self) -> None:
            ran.append("sweep")
            await asyncio.sleep(3600)

    lent = LoanedCapacity("n1", Service(), LendingPods(LEND), inventory, list,  # type: ignore[arg-type]
                          Sweep())  # type: ignore[arg-type]

    async def briefly() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await lent.run()

    asyncio.run(briefly())
    assert sorted(ran) == ["loop", "sweep"]


@pytest.mark.parametrize(("flag", "seconds"), [((), WEEK), (("--checkpoint-retention", "36h"), 1.5 * DAY),
                                               (("--checkpoint-retention", "0"), 0.0)])
def test_the_flag_reaches_the_options(monkeypatch: pytest.MonkeyPatch, flag: tuple[str, ...],
                                      seconds: float) -> None:
    seen: list[LendingOptions | None] = []

    async def run(options: AgentOptions) -> None:
        seen.append(options.lending)

    monkeypatch.setattr(node_agent_cmd, "run_agent", run)
    result = CliRunner().invoke(cli, ["node-agent", "--lending", *flag])
    assert result.exit_code == 0, result.output
    assert [o.checkpoint_retention_s if o else None for o in seen] == [seconds]


def test_a_bad_flag_value_stops_the_start() -> None:
    result = CliRunner().invoke(cli, ["node-agent", "--lending", "--checkpoint-retention", "a week"])
    assert result.exit_code == 2 and "--checkpoint-retention" in result.output and "not a duration" in result.output
