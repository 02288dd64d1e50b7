"""Removing task checkpoint directories nobody will resume from (``--checkpoint-retention``).

A task's directory (``<--checkpoint-dir>/<namespace>/<task>``, :mod:`~gpupool.nodeagent.lending.checkpoint`)
outlives its pods on purpose: the task's next pod resumes from it. But a task that never comes back
(a finished Job, a deleted Deployment) would keep its checkpoints, each as large as the workload's
memory, for ever. So the lending loop sweeps the root every :data:`SWEEP_EVERY_S` and removes a task
directory whose newest change is older than the retention, then its namespace directory once empty.

What is never removed, whatever its age:

- a task directory a pod on this node has (the pods the lending side lists, which is every pod a
  grant mounted a directory for) or that a reclaim in progress writes. The sweep also touches these
  (their mtime), so agents on other nodes sharing the root see them live however long the pod runs
  without writing a checkpoint; a grant touches its directory too
  (:meth:`~gpupool.nodeagent.lending.checkpoint.CheckpointStore.directory`);
- anything reached through a link: the walk opens every directory relative to its parent without
  following links (``O_NOFOLLOW``, ``dir_fd``), so a link a tenant left in its directory is removed
  as a link and what it names is left alone;
- anything when the root is ``/`` or not a directory (a mistyped flag must not empty a node).

Age is the newest modification time of the task directory and its entries; where those all look old,
the whole tree is walked before removal (a pod on another node writing deep inside keeps it). Several
agents may share the root (NFS): a directory is first renamed to a dot name in its namespace
directory (one remover wins the rename; the others see it gone), then removed; an entry gone
meanwhile is no error, and a dot name left by a remover that died is removed by the next sweep.
A grant on another node at the very moment its directory is renamed may find it gone and start
the task over: the directory was idle for the whole retention before that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from gpupool.nodeagent.lending.checkpoint import CheckpointStore

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 300.0
"""How often the lending loop sweeps the root (a sweep lists every task directory's top level)."""
TRASH_PREFIX = ".removing-"
"""A task directory being removed, renamed in its namespace directory (never a task's own name)."""
MAX_DEPTH = 256
"""Deeper than this, a tree is left in place (logged): each level holds one open directory."""
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

TaskDirs = Callable[[], Collection[tuple[str, str]] | None]
"""The (namespace directory, task directory) names in use on this node; ``None``: not known yet."""


def root_problem(root: str) -> str | None:
    """Why the sweep must not act on ``root``, or ``None``."""
    resolved = os.path.realpath(root)
    if resolved == "/":
        return f"the checkpoint root {root} is /"
    if not os.path.isdir(resolved):
        return f"the checkpoint root {root} is not a directory"
    return None


@dataclass
class Sweep:
    """What one sweep did (for the log and tests)."""

    removed: list[str] = field(default_factory=list)
    """``<namespace>/<task>`` directories removed, and ``<namespace>`` directories emptied."""
    kept_in_use: int = 0
    failed: int = 0


class CheckpointRetention:
    """Sweeps ``store``'s root of task directories idle for longer than ``retention_s`` (0: none is
    removed; the directories in use are still touched)."""

    def __init__(self, store: CheckpointStore, retention_s: float, in_use: TaskDirs,
                 every_s: float = SWEEP_EVERY_S, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.retention_s = retention_s
        self.every_s = every_s
        self._in_use = in_use
        self._clock = clock
        self._told_root = False

    async def run(self) -> None:
        """Sweep every :attr:`every_s` (the first after one interval: the pods are listed by then), until cancelled."""
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await asyncio.to_thread(self.sweep)
            except Exception:
                log.exception("checkpoint retention: the sweep failed; trying again in %g s", self.every_s)

    def sweep(self) -> Sweep | None:
        """One pass over the root; ``None`` when it did nothing (pods not known yet, a refused root)."""
        in_use = self._in_use()
        if in_use is None:
            return None
        problem = root_problem(self.store.root)
        if problem is not None:
            if not self._told_root:
                log.error("checkpoint retention: %s: nothing is removed from it", problem)
                self._told_root = True
            return None
        root = os.path.realpath(self.store.root)
        self._touch(root, in_use)
        done = Sweep()
        if self.retention_s <= 0:
            return done
        try:
            root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("checkpoint retention: cannot open %s: %s", root, exc)
            return None
        used = set(in_use)
        try:
            for namespace in _directories(root_fd):
                self._sweep_namespace(root_fd, namespace, used, done)
        finally:
            os.close(root_fd)
        if done.removed or done.failed:
            log.info("checkpoint retention: removed %s (idle for more than %g s; %d in use kept, %d failed)",
                     ", ".join(done.removed) or "nothing", self.retention_s, done.kept_in_use, done.failed)
        return done

    def _touch(self, root: str, in_use: Collection[tuple[str, str]]) -> None:
        """Mark the directories this node's pods have as live, for every agent sharing the root."""
        for namespace, task in in_use:
            with contextlib.suppress(OSError):  # not made yet (a pod without a grant), or gone
                os.utime(os.path.join(root, namespace, task), follow_symlinks=False)

    def _sweep_namespace(self, root_fd: int, namespace: str, in_use: set[tuple[str, str]], done: Sweep) -> None:
        try:
            ns_fd = os.open(namespace, _DIRECTORY, dir_fd=root_fd)
        except OSError:
            return  # gone, or a link: never followed
        cutoff = self._clock() - self.retention_s
        try:
            for task in _directories(ns_fd, dot_names=True):
                if task.startswith(TRASH_PREFIX):  # a remover died mid-way, or another removes it now
                    if remove_tree(ns_fd, task) is None:
                        done.failed += 1
                    continue
                if task.startswith(".") or _newest_top(ns_fd, task) > cutoff:
                    continue
                with self.store.lock:  # a grant on this node makes and touches under it
                    if (namespace, task) in in_use or (namespace, task) in set(self._in_use() or ()):
                        done.kept_in_use += 1
                        continue
                    if _newest_top(ns_fd, task) > cutoff:
                        continue
                    trash = f"{TRASH_PREFIX}{task}-{uuid.uuid4().hex[:8]}"
                    try:
                        os.rename(task, trash, src_dir_fd=ns_fd, dst_dir_fd=ns_fd)
                    except FileNotFoundError:
                        continue  # another agent took it
                    except OSError as exc:
                        log.warning("checkpoint retention: cannot move %s/%s aside: %s", namespace, task, exc)
                        done.failed += 1
                        continue
                newest = _newest_in_tree(ns_fd, trash)
                if newest is not None and newest > cutoff:  # written deep inside: put back where it was
                    _put_back(ns_fd, trash, task, namespace)
                    continue
                if remove_tree(ns_fd, trash) is None:
                    done.failed += 1
                else:
                    done.removed.append(f"{namespace}/{task}")
        finally:
            os.close(ns_fd)
        with self.store.lock:
            try:
                os.rmdir(namespace, dir_fd=root_fd)  # only an empty one
                done.removed.append(namespace)
            except OSError:
                pass


def _put_back(ns_fd: int, trash: str, task: str, namespace: str) -> None:
    try:
        os.rename(trash, task, src_dir_fd=ns_fd, dst_dir_fd=ns_fd)
    except OSError as exc:  # a new directory by that name meanwhile: the new pod starts over
        log.warning("checkpoint retention: %s/%s changed while it was moved aside and cannot be put back (%s); "
                    "it is removed at the next sweep", namespace, task, exc)


def _directories(dir_fd: int, dot_names: bool = False) -> list[str]:
    """The names of the real directories (not links) in ``dir_fd``."""
    try:
        with os.scandir(dir_fd) as entries:
            return [e.name for e in entries if (dot_names or not e.name.startswith("."))
                    and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _newest_top(parent_fd: int, name: str) -> float:
    """The newest modification time of directory ``name`` and its entries (not followed); +inf when unreadable."""
    newest = _newest_in_tree(parent_fd, name, levels=0)
    return float("inf") if newest is None else newest


def _newest_in_tree(parent_fd: int, name: str, levels: int = MAX_DEPTH) -> float | None:
    """The newest modification time in the tree ``name`` down to ``levels`` directories below it (links
    not followed; a directory deeper counts by its own time); ``None``: unreadable."""
    try:
        newest = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mtime
        fd = os.open(name, _DIRECTORY, dir_fd=parent_fd)
    except OSError:
        return None
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if levels > 0 and entry.is_dir(follow_symlinks=False):
                    inner = _newest_in_tree(fd, entry.name, levels - 1)
                    if inner is not None:
                        newest = max(newest, inner)
                    continue
                try:
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                except OSError:
                    continue
    except OSError:
        return None
    finally:
        os.close(fd)
    return newest


def remove_tree(parent_fd: int, name: str, depth: int = 0) -> int | None:
    """Remove ``name`` in ``parent_fd`` with all it holds, never following a link (a link is removed as
    one); entries gone meanwhile (another remover) are no failure. The entries removed, or ``None``
    when something is left."""
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        try:
            os.unlink(name, dir_fd=parent_fd)
        except FileNotFoundError:
            return 0
        except OSError:
            return None
        return 1
    if depth >= MAX_DEPTH:
        log.warning("checkpoint retention: a tree deeper than %d levels is left in place", MAX_DEPTH)
        return None
    try:
        fd = os.open(name, _DIRECTORY, dir_fd=parent_fd)
    except FileNotFoundError:
        return 0
    except OSError:
        return None
    count, left = 0, False
    try:
        with os.scandir(fd) as entries:
            names = [e.name for e in entries]
        for inner in names:
            removed = remove_tree(fd, inner, depth + 1)
            if removed is None:
                left = True
            else:
                count += removed
    except OSError:
        left = True
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except FileNotFoundError:
        pass
    except OSError:
        return None
    return None if left else count + 1
