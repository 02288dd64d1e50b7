"""criu-run, the entrypoint wrapper that dumps a workload with CRIU on the checkpoint signal
(gpupool/shim/src/criu_run/criu_run.c), against a stand-in ``criu``: a shell script that records
how it was called and does what the real one's exit says (a dump writes ``inventory.img`` and ends
the tree, as CRIU does). The real CRIU in real containers: tests/e2e/test_process_checkpoint_e2e.py.

Every test runs twice: against the shipped static build and against a dynamic build with
AddressSanitizer and UndefinedBehaviorSanitizer that stops at the first report (a static binary
cannot carry ASan), so hostile input (a damaged dump, a huge bound) that reaches undefined
behaviour fails the test even where the static build happens to survive it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpupool.nodeagent.lending.checkpoint_files import newest_checkpoint
from gpupool.shim.build import ShimBuildError, find_compiler
from gpupool.shim.criu_run_build import SOURCE, build_criu_run

FAKE_CRIU = r"""#!/bin/sh
echo "$XDG_RUNTIME_DIR|$*" >> "$CALLS"
[ -n "$CRIU_FAILS" ] && exit 1
if [ "$1" = dump ]; then
  while [ $# -gt 0 ]; do
    case "$1" in -t) pid=$2; shift;; -D) dir=$2; shift;; esac; shift
  done
  printf 'inv' > "$dir/inventory.img"
  kill -9 "$pid"
fi
exit 0
"""


SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g", "-O1")


@pytest.fixture(scope="module", params=["static", "sanitized"])
def wrapper(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param == "static":
        try:
            return build_criu_run(werror=True)
        except ShimBuildError as exc:
            pytest.skip(f"criu-run cannot be built here: {exc}")
    built = tmp_path_factory.mktemp("sanitized") / "criu-run"
    done = subprocess.run([*find_compiler(), "-std=gnu11", "-Wall", "-Wextra", "-Werror", *SANITIZE, "-o", str(built),
                           str(SOURCE)], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        pytest.skip(f"no sanitizer build here: {done.stderr[-400:]}")
    return built


@pytest.fixture
def fake_criu(tmp_path: Path) -> Path:
    tools = tmp_path / "tools"
    tools.mkdir()
    criu = tools / "criu"
    criu.write_text(FAKE_CRIU)
    criu.chmod(0o755)
    return criu


def start(wrapper: Path, criu: Path, tmp_path: Path, command: str, **env: str) -> subprocess.Popen[str]:
    checkpoints = tmp_path / "checkpoint"
    checkpoints.mkdir(exist_ok=True)
    environment = {"PATH": os.environ.get("PATH", os.defpath), "CALLS": str(tmp_path / "calls"),
                   "GPUPOOL_CHECKPOINT_DIR": str(checkpoints), "GPUPOOL_CRIU": str(criu), **env}
    return subprocess.Popen([str(wrapper), "--", "sh", "-c", command], env=environment, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def started(process: subprocess.Popen[str], tmp_path: Path) -> None:
    """Wait until the command wrote its ``ready`` file (its traps are set)."""
    deadline = time.monotonic() + 10
    while not (tmp_path / "ready").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.02)


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


LOOP = 'touch "$R"; while :; do sleep 0.05; done'


def test_the_command_runs_as_a_child_and_its_exit_status_is_the_wrappers(
        wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    process = start(wrapper, fake_criu, tmp_path, "echo hi; exit 3")
    out, _ = process.communicate(timeout=10)
    assert (process.returncode, out) == (3, "hi\n") and calls(tmp_path) == []


def test_sigterm_is_passed_on_to_the_command(wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    process = start(wrapper, fake_criu, tmp_path, f"trap 'exit 7' TERM; {LOOP}", R=str(tmp_path / "ready"))
    started(process, tmp_path)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 7 and calls(tmp_path) == []


def test_the_checkpoint_signal_dumps_the_command_under_a_dot_name_then_renames_and_exits_0(
        wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "criu-4").mkdir()  # an older dump: the next one is criu-5
    (fake_criu.parent / "criu.kdat").write_bytes(b"kdat")  # the node's kernel-feature cache beside criu
    process = start(wrapper, fake_criu, tmp_path, LOOP, R=str(tmp_path / "ready"))
    started(process, tmp_path)
    process.send_signal(signal.SIGUSR1)
    out, _ = process.communicate(timeout=10)
    assert process.returncode == 0, out
    dump = tmp_path / "checkpoint" / "criu-5"
    assert sorted(p.name for p in dump.iterdir()) == ["descriptors", "inventory.img", "pids-max"]
    assert not (tmp_path / "checkpoint" / ".criu-5").exists()
    descriptors = dict(line.split(" ", 1) for line in (dump / "descriptors").read_text().splitlines())
    assert descriptors["0"] == "/dev/null" and descriptors["1"].startswith("pipe:[")
    assert int((dump / "pids-max").read_text()) > 0
    [call] = calls(tmp_path)
    runtime, args = call.split("|")
    assert runtime == str(fake_criu.parent)  # CRIU reads criu.kdat from $XDG_RUNTIME_DIR in --unprivileged mode
    assert args.startswith("dump -t ") and f"-D {tmp_path}/checkpoint/.criu-5" in args
    assert "--unprivileged" in args and "--manage-cgroups=ignore" in args
    assert f"dumped process {args.split()[2]} and its children into {dump}" in out
    assert newest_checkpoint(str(tmp_path / "checkpoint")) == "criu-5"


def test_a_failed_dump_keeps_its_dot_name_and_passes_the_signal_on_to_the_command(
        wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    """The command's own checkpoint (the protocol without CRIU) is then what resumes."""
    own = f'trap \'echo 9 > "$GPUPOOL_CHECKPOINT_DIR/ckpt-9"; exit 0\' USR1; {LOOP}'
    process = start(wrapper, fake_criu, tmp_path, own, R=str(tmp_path / "ready"), CRIU_FAILS="1")
    started(process, tmp_path)
    process.send_signal(signal.SIGUSR1)
    out, _ = process.communicate(timeout=10)
    assert process.returncode == 0 and "criu dump of process" in out and "passing the signal on" in out, out
    assert (tmp_path / "checkpoint" / ".criu-1").is_dir() and (tmp_path / "checkpoint" / "ckpt-9").is_file()
    assert newest_checkpoint(str(tmp_path / "checkpoint")) == "ckpt-9"
    assert calls(tmp_path)[0].split("|")[0] == ""  # no criu.kdat beside criu: no XDG_RUNTIME_DIR set for it


def test_a_resume_from_an_application_checkpoint_starts_the_command_without_criu(
        wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "ckpt-3").write_text("3\n")
    process = start(wrapper, fake_criu, tmp_path, 'echo "from $GPUPOOL_RESUME_FROM"',
                    GPUPOOL_RESUME_FROM=str(tmp_path / "checkpoint" / "ckpt-3"))
    out, _ = process.communicate(timeout=10)
    assert (process.returncode, out) == (0, f"from {tmp_path}/checkpoint/ckpt-3\n") and calls(tmp_path) == []


def test_a_failed_restore_starts_the_command_afresh(wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    dump = tmp_path / "checkpoint" / "criu-2"
    dump.mkdir(parents=True)
    (dump / "inventory.img").write_bytes(b"inv")
    (dump / "descriptors").write_text("0 /dev/null\n1 pipe:[123]\n2 pipe:[124]\n")
    (dump / "pids-max").write_text("40\n")
    process = start(wrapper, fake_criu, tmp_path, "echo afresh", GPUPOOL_RESUME_FROM=str(dump), CRIU_FAILS="1")
    out, _ = process.communicate(timeout=10)
    assert process.returncode == 0 and out.endswith("starting sh afresh\nafresh\n"), out
    [call] = calls(tmp_path)
    args = call.split("|")[1].split()
    assert args[:3] == ["restore", "-D", str(dump)] and "--restore-sibling" in args and "--unprivileged" in args
    # the new container's pipes stand in for the dumped ones; /dev/null is reopened by path
    assert args[args.index("fd[1]:pipe:[123]") - 1:][:2] == ["--inherit-fd", "fd[1]:pipe:[123]"]
    assert "fd[2]:pipe:[124]" in args and not any(a.startswith("fd[0]") for a in args)


def test_usage_and_an_unknown_signal_are_refused(wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    alone = subprocess.run([str(wrapper)], capture_output=True, text=True, timeout=10, check=False)
    assert alone.returncode == 2 and "usage: criu-run" in alone.stderr
    process = start(wrapper, fake_criu, tmp_path, "true", GPUPOOL_CHECKPOINT_SIGNAL="SIGNOPE")
    out, _ = process.communicate(timeout=10)
    assert process.returncode == 2 and "is not a signal" in out


#: A stand-in cuda-checkpoint: a process is a CUDA process when $CUDA_STATES/<pid> holds its state
#: (running, checkpointed, locked); --toggle flips running and checkpointed, unless TOGGLE_FAILS.
FAKE_CUDA_CHECKPOINT = r"""#!/bin/sh
echo "cuda-checkpoint|$*" >> "$CALLS"
state="$CUDA_STATES/$3"
[ -f "$state" ] || { echo "cuda-checkpoint: process $3 is not a CUDA process" >&2; exit 1; }
case "$1" in
--get-state) cat "$state" ;;
--toggle)
  [ -n "$TOGGLE_FAILS" ] && { echo "cuda-checkpoint: OS call failed" >&2; exit 3; }
  case "$(cat "$state")" in
  running) echo checkpointed > "$state" ;;
  checkpointed) echo running > "$state" ;;
  *) exit 2 ;;
  esac ;;
esac
"""

#: The command marks itself a running CUDA process and starts one non-CUDA child (the sleeps).
CUDA_LOOP = f'echo running > "$CUDA_STATES/$$"; {LOOP}'


@pytest.fixture
def cuda_states(fake_criu: Path, tmp_path: Path) -> Path:
    """The stand-in tool beside CRIU (where the agent's mount puts it) and its state directory."""
    tool = fake_criu.parent / "cuda-checkpoint"
    tool.write_text(FAKE_CUDA_CHECKPOINT)
    tool.chmod(0o755)
    states = tmp_path / "cuda"
    states.mkdir()
    return states


def checkpointed(wrapper: Path, criu: Path, tmp_path: Path, states: Path, command: str,
                 **env: str) -> tuple[int, str]:
    process = start(wrapper, criu, tmp_path, command, R=str(tmp_path / "ready"), CUDA_STATES=str(states), **env)
    started(process, tmp_path)
    process.send_signal(signal.SIGUSR1)
    out, _ = process.communicate(timeout=20)
    return process.returncode, out


def cuda_calls(tmp_path: Path) -> list[str]:
    return [c.split("|")[1] if c.startswith("cuda-checkpoint|") else "criu " + c.split("|")[1].split()[0]
            for c in calls(tmp_path)]


def test_running_cuda_processes_are_toggled_before_the_dump_and_listed_in_it(
        wrapper: Path, fake_criu: Path, tmp_path: Path, cuda_states: Path) -> None:
    rc, out = checkpointed(wrapper, fake_criu, tmp_path, cuda_states, CUDA_LOOP)
    assert rc == 0, out
    [cuda_pid] = [int(p.name) for p in cuda_states.iterdir()]
    done = cuda_calls(tmp_path)
    # the state of each process of the tree (the command first, then its sleep), a toggle for the
    # CUDA one alone, then the dump; the non-CUDA sleep is never toggled
    assert done[:2] == [f"--get-state --pid {cuda_pid}", f"--toggle --pid {cuda_pid}"] and done[-1] == "criu dump"
    assert len([c for c in done[2:-1] if c.startswith("--get-state --pid ")]) >= 1, done
    assert [c for c in done if c.startswith("--toggle")] == [f"--toggle --pid {cuda_pid}"]
    dump = tmp_path / "checkpoint" / "criu-1"
    assert (dump / "cuda-pids").read_text() == f"{cuda_pid}\n"  # written before the rename
    assert (cuda_states / str(cuda_pid)).read_text().strip() == "checkpointed"
    assert "suspended 1 CUDA process(es)" in out


def test_a_locked_process_aborts_the_dump_and_what_was_toggled_is_toggled_back(
        wrapper: Path, fake_criu: Path, tmp_path: Path, cuda_states: Path) -> None:
    """The command (toggled first: the lower pid) runs on; the signal is passed on as after a failed dump."""
    locked = f'trap "exit 0" USR1; echo running > "$CUDA_STATES/$$"; sh -c \'echo locked > "$CUDA_STATES/$$"; ' \
             f'exec sleep 5 >/dev/null 2>&1\' & {LOOP}'
    rc, out = checkpointed(wrapper, fake_criu, tmp_path, cuda_states, locked)
    assert rc == 0 and "cannot be suspended (locked or failed): no dump" in out and "passing the signal on" in out, out
    states = {int(p.name): p.read_text().strip() for p in cuda_states.iterdir()}
    first = min(states)
    assert states == {first: "running", max(states): "locked"}
    done = cuda_calls(tmp_path)
    assert not any(c.startswith("criu") for c in done)  # never dumped
    assert [c for c in done if c.startswith("--toggle")] == [f"--toggle --pid {first}"] * 2
    assert not (tmp_path / "checkpoint" / "criu-1").exists()


def test_a_failed_dump_toggles_the_cuda_processes_back(
        wrapper: Path, fake_criu: Path, tmp_path: Path, cuda_states: Path) -> None:
    own = f'trap "exit 0" USR1; {CUDA_LOOP}'
    rc, out = checkpointed(wrapper, fake_criu, tmp_path, cuda_states, own, CRIU_FAILS="1")
    assert rc == 0 and "criu dump of process" in out and "1 CUDA process(es) back on the GPU" in out, out
    [cuda_pid] = [int(p.name) for p in cuda_states.iterdir()]
    assert (cuda_states / str(cuda_pid)).read_text().strip() == "running"
    assert cuda_calls(tmp_path)[-3:] == ["criu dump", f"--get-state --pid {cuda_pid}", f"--toggle --pid {cuda_pid}"]


def test_without_the_tool_nothing_is_toggled(wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    states = tmp_path / "cuda"
    states.mkdir()
    rc, out = checkpointed(wrapper, fake_criu, tmp_path, states, CUDA_LOOP)
    assert rc == 0 and cuda_calls(tmp_path) == ["criu dump"], out
    assert not (tmp_path / "checkpoint" / "criu-1" / "cuda-pids").exists()


def fake_dump(tmp_path: Path, pids: list[int]) -> Path:
    dump = tmp_path / "checkpoint" / "criu-2"
    dump.mkdir(parents=True)
    (dump / "inventory.img").write_bytes(b"inv")
    (dump / "cuda-pids").write_text("".join(f"{p}\n" for p in pids))
    return dump


#: A stand-in CRIU whose restore "restores" a process: a detached sleep whose pid it writes into
#: --pidfile (an orphan, it becomes criu-run's child as --restore-sibling's tree would).
RESTORING_CRIU = r"""#!/bin/sh
echo "$XDG_RUNTIME_DIR|$*" >> "$CALLS"
while [ $# -gt 0 ]; do case "$1" in --pidfile) pidfile=$2; shift;; esac; shift; done
setsid sleep "${RESTORED_RUNS:-0.3}" </dev/null >/dev/null 2>&1 &
echo $! > "$pidfile"
"""


@pytest.mark.parametrize("toggle_fails", [False, True], ids=["toggled-back", "toggle-back-fails"])
def test_after_a_restore_the_dumped_cuda_processes_are_toggled_back(
        wrapper: Path, fake_criu: Path, tmp_path: Path, cuda_states: Path, toggle_fails: bool) -> None:
    """A process that cannot be put back on the GPU cannot go on: the restored tree ends and the
    command starts afresh, as after a failed restore."""
    fake_criu.write_text(RESTORING_CRIU)
    pids = [NO_PID_A, NO_PID_B]
    for pid in pids:
        (cuda_states / str(pid)).write_text("checkpointed\n")
    dump = fake_dump(tmp_path, pids)
    env = {"TOGGLE_FAILS": "1"} if toggle_fails else {}
    process = start(wrapper, fake_criu, tmp_path, "echo afresh", GPUPOOL_RESUME_FROM=str(dump),
                    CUDA_STATES=str(cuda_states), **env)
    out, _ = process.communicate(timeout=20)
    assert process.returncode == 0, out
    done = cuda_calls(tmp_path)
    assert done[0] == "criu restore"
    assert done[1:] == [f"--get-state --pid {NO_PID_B}", f"--toggle --pid {NO_PID_B}",
                        f"--get-state --pid {NO_PID_A}", f"--toggle --pid {NO_PID_A}"]
    if toggle_fails:
        assert "cannot use the GPU: ending them" in out and out.endswith("starting sh afresh\nafresh\n"), out
    else:
        assert "put 2 CUDA process(es) back on the GPU" in out and "afresh" not in out, out
        assert {p.read_text().strip() for p in cuda_states.iterdir()} == {"running"}


#: pids no process has (above pid_max): the stand-in tool answers for them from its state files
NO_PID_A = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
NO_PID_B = NO_PID_A + 1


def test_a_tool_named_by_the_environment_that_hangs_is_killed_at_its_bound_and_nothing_is_dumped(
        wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    tool = tmp_path / "elsewhere" / "cuda-checkpoint"
    tool.parent.mkdir()
    tool.write_text('#!/bin/sh\necho "cuda-checkpoint|$*" >> "$CALLS"\nexec sleep 30 >/dev/null\n')
    tool.chmod(0o755)
    own = f'trap "exit 0" USR1; {LOOP}'
    began = time.monotonic()
    rc, out = checkpointed(wrapper, fake_criu, tmp_path, tmp_path, own, GPUPOOL_CUDA_CHECKPOINT=str(tool),
                           GPUPOOL_CUDA_CHECKPOINT_TIMEOUT="0.3")
    assert rc == 0 and "no answer within 300 ms; killed" in out and "passing the signal on" in out, out
    assert time.monotonic() - began < 5
    assert [c for c in cuda_calls(tmp_path) if not c.startswith("--get-state")] == []  # no toggle, no dump


def pid_namespaces() -> bool:
    try:
        return subprocess.run(["unshare", "-rpf", "--mount-proc", "true"], capture_output=True,
                              timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def process_states(listing: str) -> dict[int, tuple[str, str]]:
    """pid: (command name, state) of each ``/proc/<pid>/stat`` line."""
    states = {}
    for line in listing.splitlines():
        head, _, tail = line.rpartition(")")
        pid, _, name = head.partition(" (")
        states[int(pid)] = (name, tail.split()[0])
    return states


#: Two orphans (their subshells exit at once) end while the command runs; it then lists the
#: processes it can see and traps the signal the test sends.
ORPHANS_THEN_LIST = ('(sleep 0.1 &); (sleep 0.2 &); sleep 0.6; for f in /proc/[0-9]*/stat; do read -r l < "$f"; '
                     'echo "$l"; done > "$L"; trap "exit 7" TERM INT; ' + LOOP)


@pytest.mark.skipif(not pid_namespaces(), reason="no unprivileged pid namespaces here (unshare -rpf)")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_as_pid_1_it_reaps_orphans_and_passes_the_stop_signal_on(
        wrapper: Path, fake_criu: Path, tmp_path: Path, sig: signal.Signals) -> None:
    """As a container's init (its own pid namespace, /proc of it), what `kubectl delete` needs: the
    runtime's SIGTERM, sent from outside the namespace to pid 1, reaches the command, which ends at
    once (not at the grace period's SIGKILL); orphans reparented to pid 1 leave no zombies."""
    listing = tmp_path / "listing"
    environment = {"PATH": os.environ.get("PATH", os.defpath), "CALLS": str(tmp_path / "calls"),
                   "GPUPOOL_CRIU": str(fake_criu), "R": str(tmp_path / "ready"), "L": str(listing)}
    process = subprocess.Popen(["unshare", "-rpf", "--mount-proc", str(wrapper), "--", "sh", "-c", ORPHANS_THEN_LIST],
                               env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    init = 0
    try:
        started(process, tmp_path)
        init = int(Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text())  # pid 1, seen from here
        states = process_states(listing.read_text())
        assert states[1][0] == "criu-run" and states[2][0] == "sh", states
        assert not [pid for pid, (_, state) in states.items() if state == "Z"], states  # both sleeps reaped
        began = time.monotonic()
        os.kill(init, sig)
        assert process.wait(timeout=10) == 7, process.communicate()[0]
        assert time.monotonic() - began < 2
    finally:
        if process.poll() is None and init:
            os.kill(init, signal.SIGKILL)  # the namespace's init: every process of it goes


def test_orphans_of_the_tree_are_reaped_when_it_is_not_pid_1(wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    """A child subreaper: the orphans come to it, not to the node's init, and it reaps them."""
    process = start(wrapper, fake_criu, tmp_path, "(sleep 0.1 &); (sleep 0.2 &); sleep 0.6; " + LOOP,
                    R=str(tmp_path / "ready"))
    started(process, tmp_path)
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    states = {c: Path(f"/proc/{c}/stat").read_text().rpartition(")")[2].split()[0] for c in children}
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=10)
    assert len(children) == 1 and "Z" not in states.values(), states


def test_a_resume_path_with_a_trailing_slash_names_the_dump(wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    dump = tmp_path / "checkpoint" / "criu-2"
    dump.mkdir(parents=True)
    (dump / "inventory.img").write_bytes(b"inv")
    process = start(wrapper, fake_criu, tmp_path, "echo afresh", GPUPOOL_RESUME_FROM=f"{dump}//", CRIU_FAILS="1")
    out, _ = process.communicate(timeout=10)
    assert process.returncode == 0 and "afresh" in out, out
    [call] = calls(tmp_path)
    assert call.split("|")[1].split()[:3] == ["restore", "-D", str(dump)]


def test_a_criu_dump_cut_short_is_said_and_the_command_starts(wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    dump = tmp_path / "checkpoint" / "criu-2"
    dump.mkdir(parents=True)  # no inventory.img
    process = start(wrapper, fake_criu, tmp_path, "echo afresh", GPUPOOL_RESUME_FROM=str(dump))
    out, _ = process.communicate(timeout=10)
    assert process.returncode == 0 and calls(tmp_path) == [], out
    assert out == f"criu-run: GPUPOOL_RESUME_FROM={dump} is not a finished CRIU dump (no inventory.img)\nafresh\n"


@pytest.mark.parametrize("pids_max", ["9223372036854775807", "-5", "junk"])
def test_a_damaged_pids_max_starts_criu_with_any_id(
        wrapper: Path, fake_criu: Path, tmp_path: Path, pids_max: str) -> None:
    """No id above it is asked for (LONG_MAX + 1 was signed overflow: the sanitized build stops)."""
    dump = tmp_path / "checkpoint" / "criu-2"
    dump.mkdir(parents=True)
    (dump / "inventory.img").write_bytes(b"inv")
    (dump / "pids-max").write_text(pids_max + "\n")
    process = start(wrapper, fake_criu, tmp_path, "echo afresh", GPUPOOL_RESUME_FROM=str(dump), CRIU_FAILS="1")
    out, _ = process.communicate(timeout=10)
    assert process.returncode == 0 and "cannot start criu as process" not in out and out.endswith("afresh\n"), out
    assert len(calls(tmp_path)) == 1


@pytest.mark.parametrize("listed", ["12abc\n", "99999999999\n", "-3\n", "1\n" * 300])
def test_a_damaged_cuda_pids_list_ends_the_restored_tree_and_starts_afresh(
        wrapper: Path, fake_criu: Path, tmp_path: Path, cuda_states: Path, listed: str) -> None:
    """Which processes stay checkpointed is not known, and one left checkpointed cannot go on (the
    list was read up to its first bad word, and a first bad word meant "no CUDA processes")."""
    fake_criu.write_text(RESTORING_CRIU)
    dump = fake_dump(tmp_path, [])
    (dump / "cuda-pids").write_text(listed)
    process = start(wrapper, fake_criu, tmp_path, "echo afresh", GPUPOOL_RESUME_FROM=str(dump),
                    CUDA_STATES=str(cuda_states), RESTORED_RUNS="30")
    out, _ = process.communicate(timeout=20)
    assert process.returncode == 0 and "cuda-pids is damaged" in out, out
    assert out.endswith("starting sh afresh\nafresh\n"), out
    assert [c for c in cuda_calls(tmp_path) if c.startswith("--")] == []  # no pid of it asked about


def test_a_bound_past_int_max_milliseconds_is_no_bound_of_zero(
        wrapper: Path, fake_criu: Path, tmp_path: Path, cuda_states: Path) -> None:
    """3e6 s is 3e9 ms, past INT_MAX: cast to int it was INT_MIN, and every call timed out at once."""
    rc, out = checkpointed(wrapper, fake_criu, tmp_path, cuda_states, CUDA_LOOP,
                           GPUPOOL_CUDA_CHECKPOINT_TIMEOUT="3000000")
    assert rc == 0 and "suspended 1 CUDA process(es)" in out and "no answer" not in out, out


#: A restore whose tree has 300 processes (a shell and its sleeps): more than the 256 of a CUDA dump.
BIG_RESTORING_CRIU = r"""#!/bin/sh
echo "$XDG_RUNTIME_DIR|$*" >> "$CALLS"
while [ $# -gt 0 ]; do case "$1" in --pidfile) pidfile=$2; shift;; esac; shift; done
setsid sh -c 'i=0; while [ $i -lt 300 ]; do sleep "$NAP" & i=$((i + 1)); done; touch "$R"; wait' \
  </dev/null >/dev/null 2>&1 &
echo $! > "$pidfile"
while [ ! -e "$R" ]; do sleep 0.05; done
"""


def test_a_restored_tree_that_cannot_go_on_is_ended_whole_however_large(
        wrapper: Path, fake_criu: Path, tmp_path: Path, cuda_states: Path) -> None:
    """Every process of it is killed before CMD starts afresh, not the first 256: survivors would
    run beside the fresh CMD."""
    fake_criu.write_text(BIG_RESTORING_CRIU)
    dump = fake_dump(tmp_path, [])
    (dump / "cuda-pids").write_text("damaged\n")
    nap = f"{os.getpid() % 1000 + 40}.{time.monotonic_ns() % 997}"  # a duration no other process sleeps
    process = start(wrapper, fake_criu, tmp_path, "echo afresh", GPUPOOL_RESUME_FROM=str(dump),
                    CUDA_STATES=str(cuda_states), R=str(tmp_path / "ready"), NAP=nap)
    survivors: list[str] = []
    try:
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0 and out.endswith("starting sh afresh\nafresh\n"), out
        time.sleep(0.2)
        survivors = subprocess.run(["pgrep", "-f", f"^sleep {nap}$"], capture_output=True, text=True,
                                   check=False).stdout.split()
        assert survivors == []
    finally:
        for pid in survivors:  # this test's own sleeps (their duration is this test's)
            os.kill(int(pid), signal.SIGKILL)


def test_a_tool_that_cannot_run_is_said_once_and_the_dump_goes_on(
        wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    """An image without glibc cannot run NVIDIA's tool: every process is taken for no CUDA process
    (a workload without CUDA must still be dumped), and stderr says why nothing was suspended."""
    tool = fake_criu.parent / "cuda-checkpoint"
    tool.write_text("#!/nonexistent/ld-linux-x86-64.so.2\n")
    tool.chmod(0o755)
    rc, out = checkpointed(wrapper, fake_criu, tmp_path, tmp_path, LOOP)
    assert rc == 0 and (tmp_path / "checkpoint" / "criu-1").is_dir(), out
    told = [line for line in out.splitlines() if "cannot run" in line]
    assert told == [f"criu-run: cannot run {tool} (No such file or directory): CUDA processes are not suspended"]


#: A stand-in CRIU that both restores (a detached sleep, as RESTORING_CRIU) and dumps (as FAKE_CRIU;
#: with DUMP_FAILS the dump fails and the restored sleep goes on).
RESTORING_AND_DUMPING_CRIU = r"""#!/bin/sh
echo "$XDG_RUNTIME_DIR|$*" >> "$CALLS"
action=$1
while [ $# -gt 0 ]; do
  case "$1" in --pidfile) pidfile=$2; shift;; -t) pid=$2; shift;; -D) dir=$2; shift;; esac; shift
done
if [ "$action" = restore ]; then
  setsid sleep 30 </dev/null >/dev/null 2>&1 &
  echo $! > "$pidfile"
  exit 0
fi
[ -n "$DUMP_FAILS" ] && exit 1
printf 'inv' > "$dir/inventory.img"
kill -9 "$pid"
"""


def finished_dump(checkpoints: Path, name: str, age_s: float = 60) -> Path:
    """A dump as criu-run leaves it (``inventory.img`` in it), last changed ``age_s`` ago."""
    dump = checkpoints / name
    dump.mkdir(parents=True)
    (dump / "inventory.img").write_bytes(b"inv")
    (dump / "pages-1.img").write_bytes(b"p" * 4096)
    aged(dump, age_s)
    return dump


def aged(path: Path, age_s: float) -> None:
    when = time.time() - age_s
    os.utime(path, (when, when), follow_symlinks=False)


def restored_then_signalled(wrapper: Path, criu: Path, tmp_path: Path, resume: Path,
                            **env: str) -> tuple[int, str]:
    """criu-run restored from ``resume``, then given the checkpoint signal: its exit and output."""
    criu.write_text(RESTORING_AND_DUMPING_CRIU)
    process = start(wrapper, criu, tmp_path, "echo afresh", GPUPOOL_RESUME_FROM=str(resume), **env)
    deadline = time.monotonic() + 10
    while not any(c.split("|")[1].startswith("restore") for c in calls(tmp_path)) or not any(
            (p / "root.pid").exists() for p in (tmp_path / "checkpoint").glob(".criu-restore-*")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.02)
    time.sleep(0.2)  # the restore's log is older than the dump, also where timestamps are coarse
    process.send_signal(signal.SIGUSR1)
    out, _ = process.communicate(timeout=20)
    return process.returncode, out


def test_a_new_dump_removes_older_dumps_dumps_cut_short_and_restore_logs_once_it_is_in_place(
        wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    """Each dump is the workload's memory: the task's directory keeps the newest alone. The one it
    was restored from goes too, once the new one is complete; the workload's own files and a link
    (never followed) stay."""
    checkpoints = tmp_path / "checkpoint"
    finished_dump(checkpoints, "criu-1", age_s=120)
    restored_from = finished_dump(checkpoints, "criu-2")
    finished_dump(checkpoints, ".criu-3").joinpath("inventory.img").unlink()  # a dump cut short
    aged(checkpoints / ".criu-3", 60)
    outside = finished_dump(tmp_path, "outside")
    (checkpoints / "criu-4").symlink_to(outside)
    log = checkpoints / ".criu-restore-100"
    log.mkdir()
    (log / "restore.log").write_text("old\n")
    aged(log, 60)
    (checkpoints / "ckpt-9").write_text("9\n")
    (checkpoints / "criu-notes").mkdir()
    rc, out = restored_then_signalled(wrapper, fake_criu, tmp_path, restored_from)
    assert rc == 0 and "restored process" in out, out
    assert sorted(p.name for p in checkpoints.iterdir()) == ["ckpt-9", "criu-4", "criu-5", "criu-notes"], out
    assert (outside / "inventory.img").exists() and (checkpoints / "criu-4").is_symlink()
    assert f"removed 3 older dump(s) and 2 restore log(s) from {checkpoints}" in out, out
    assert newest_checkpoint(str(checkpoints)) == "criu-5"


def test_a_failed_dump_removes_nothing_not_even_what_it_was_restored_from(
        wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoint"
    finished_dump(checkpoints, "criu-1", age_s=120)
    restored_from = finished_dump(checkpoints, "criu-2")
    rc, out = restored_then_signalled(wrapper, fake_criu, tmp_path, restored_from, DUMP_FAILS="1")
    assert rc == 128 + signal.SIGUSR1 and "passing the signal on" in out and "removed" not in out, out
    names = sorted(p.name for p in checkpoints.iterdir())
    assert names[0] == ".criu-3" and names[1].startswith(".criu-restore-") and names[2:] == ["criu-1", "criu-2"], names
    assert (restored_from / "pages-1.img").exists()


@pytest.mark.parametrize(("keep", "left"), [("2", ["criu-3", "criu-4"]),
                                            ("junk", ["criu-1", "criu-2", "criu-3", "criu-4"]),
                                            ("0", ["criu-1", "criu-2", "criu-3", "criu-4"])])
def test_gpupool_criu_keep_keeps_the_newest_n_finished_dumps(
        wrapper: Path, fake_criu: Path, tmp_path: Path, keep: str, left: list[str]) -> None:
    checkpoints = tmp_path / "checkpoint"
    for n in (3, 1, 2):
        finished_dump(checkpoints, f"criu-{n}", age_s=100 - n)
    rc, out = checkpointed(wrapper, fake_criu, tmp_path, tmp_path, LOOP, GPUPOOL_CRIU_KEEP=keep)
    assert rc == 0 and sorted(p.name for p in checkpoints.iterdir()) == left, out
    if keep != "2":
        assert f"criu-run: GPUPOOL_CRIU_KEEP={keep} is not a count of 1 or more: no older dump is removed" in out


def test_what_changed_after_the_dump_began_is_left_to_its_writer(
        wrapper: Path, fake_criu: Path, tmp_path: Path) -> None:
    """On storage every node shares, a dump another writer is making (its directory changed after
    this dump began) is not this dump's to remove, finished or not."""
    checkpoints = tmp_path / "checkpoint"
    finished_dump(checkpoints, "criu-1", age_s=-3600)
    finished_dump(checkpoints, ".criu-2", age_s=-3600).joinpath("inventory.img").unlink()
    aged(checkpoints / ".criu-2", -3600)
    rc, out = checkpointed(wrapper, fake_criu, tmp_path, tmp_path, LOOP)
    assert rc == 0 and sorted(p.name for p in checkpoints.iterdir()) == [".criu-2", "criu-1", "criu-3"], out
    assert "removed" not in out
