"""A pytest plugin that lets several pytest runs share one suite, one test module at a time.

``scripts/test-all`` runs the end-to-end suite as two pytest sessions at once (the tests mostly wait
on control planes and kubelets, so two waits overlap on two cores). Each session collects the whole
suite; with ``-p tests.module_queue --module-queue DIR`` it runs only the modules it *claims* in
``DIR``, and claims the next unclaimed module, in collection order, when it reaches the last test of
its current one. A module is claimed by creating a file named for it with ``O_EXCL``: exactly one
session runs each module, whichever is free first, so the sessions end close together whatever the
modules cost (no hand-kept list of durations to go stale) and a session that starts late (the one
that runs the compatibility set first) simply takes fewer modules.

The unit tests are shared the same way through a queue of their own: the checks lane's session
and, once its end-to-end share is done, each e2e lane's (``scripts/test-all`` says why).

Whole modules, not single tests, because module-scoped fixtures (an extender, a kubelet with
containerd) are set up once per module and a test may rely on what an earlier one in its module
did. Each session has its own session-scoped control plane (and its own session fixtures, such as
the interception library's test programs), so the tests stay independent.

Without ``--module-queue`` the plugin does nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

OPTION = "--module-queue"


@dataclass(frozen=True)
class ModuleRun:
    """A stretch of consecutive collected tests from one module (pytest keeps a module's tests
    together unless a parametrized fixture of wider scope reorders them)."""

    module: str
    items: tuple[pytest.Item, ...]


def module_runs(items: Sequence[pytest.Item]) -> list[ModuleRun]:
    """Group the collected tests into stretches of one module each, in collection order."""
    stretches: list[tuple[str, list[pytest.Item]]] = []
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if stretches and stretches[-1][0] == module:
            stretches[-1][1].append(item)
        else:
            stretches.append((module, [item]))
    return [ModuleRun(module, tuple(run)) for module, run in stretches]


@dataclass
class ModuleQueue:
    """The claims of the sessions sharing ``directory``: one empty file per claimed module."""

    directory: Path
    mine: set[str] = field(default_factory=set)
    #: How many modules the session collected (for its summary line).
    collected: int = 0

    def claim(self, module: str) -> bool:
        """Take ``module`` for this session; False when another session took it first."""
        if module in self.mine:
            return True
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", module)
        try:
            os.close(os.open(self.directory / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return False
        self.mine.add(module)
        return True


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, metavar="DIR", default=None,
                     help="share the collected test modules with other pytest runs naming the same "
                          "(existing) directory: each module runs in exactly one of them (tests/module_queue.py)")


_QUEUE_KEY = pytest.StashKey[ModuleQueue]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """Pytest's own loop over the tests, but only over the modules this session claims; the next
    module is claimed before the current one's last test runs, so that test's teardown knows which
    test comes next (fixtures the next test shares, the control plane above all, stay up)."""
    directory = session.config.getoption(OPTION)
    if directory is None or session.config.option.collectonly:
        return None  # pytest's own loop
    if not str(directory).strip() or not Path(directory).is_dir():
        # an unset shell variable gave "": claims would land in the working directory, shared by nobody
        raise pytest.UsageError(f"{OPTION}={directory!r}: give an existing directory the runs share")
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        return None  # pytest's own loop reports the collection errors
    runs = module_runs(session.items)
    queue = ModuleQueue(Path(directory), collected=len({run.module for run in runs}))
    session.config.stash[_QUEUE_KEY] = queue

    def claim_from(start: int) -> int | None:
        return next((i for i in range(start, len(runs)) if queue.claim(runs[i].module)), None)

    current = claim_from(0)
    while current is not None:
        items = runs[current].items
        following: int | None = None
        for index, item in enumerate(items):
            if index + 1 < len(items):
                nextitem: pytest.Item | None = items[index + 1]
            else:
                following = claim_from(current + 1)
                nextitem = runs[following].items[0] if following is not None else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        current = following
    return True


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Say how much of the suite this session ran, so that its pass count is read as a share."""
    queue = config.stash.get(_QUEUE_KEY, None)
    if queue is None:
        return
    terminalreporter.write_line(
        f"module queue {queue.directory}: this run took {len(queue.mine)} of {queue.collected} modules; "
        "the other run(s) sharing the directory took the rest")
