"""The per-node state file: written atomically, read back after a restart, never fatal when bad.

Default path :data:`DEFAULT_STATE_PATH`, on tmpfs (``/run``) through a hostPath volume, so that it
outlives the agent's pod but not the node's boot. Why tmpfs: the file describes live processes
only; after a reboot none of them is alive, so a file that survived it would hold nothing true.
What must hold is that a reader and a restarted agent never see a mix of two states, and the rename
gives that on any filesystem.

A write goes to a temporary file in the same directory and is renamed over the old file (a failed
write removes the temporary and leaves the old file). On a disk the temporary file is fsync'ed
before the rename and the directory after it, so that a power loss leaves the old state or the new
one (the issue's "write, fsync, rename"); on tmpfs or ramfs there is
nothing to sync to and a power loss empties the directory anyway, so both fsyncs are skipped (this
is what keeps an open's record within milliseconds; docs/monitor.md, "Measurements"). A file that is
nevertheless torn or corrupt (a disk error, a hand edit) is moved aside as ``<name>.corrupt`` with a
logged reason and the agent starts from an empty state.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gpupool.files.replace import replace_file
from gpupool.nodeagent.linux.fs_kind import in_memory
from gpupool.nodeagent.monitor.state_codec import StateFileError, decode_state, encode_state
from gpupool.nodeagent.monitor.usage_state import UsageState

log = logging.getLogger(__name__)

DEFAULT_STATE_PATH = "/run/gpupool/monitor/state.json"
CORRUPT_SUFFIX = ".corrupt"
_MODE = 0o644  # what open() gave it under the usual umask before the shared writer


class StateFile:
    """Reads and atomically replaces one state file.

    ``sync``: None (default) fsyncs unless the file's directory is on tmpfs or ramfs (asked once, at
    the first write); True always, False never. ``sync=False`` on a disk: the rename alone is atomic
    for every process that reads the file, so an agent restart still finds the old or the new state;
    only a power loss may lose the last writes, after which no recorded holder is alive anyway.
    """

    def __init__(self, path: str | os.PathLike[str] = DEFAULT_STATE_PATH, *, sync: bool | None = None) -> None:
        self.path = Path(path)
        self._sync = sync

    @property
    def sync(self) -> bool:
        """Whether writes fsync (decided on the first use when not given)."""
        if self._sync is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._sync = not in_memory(self.path.parent)
            log.info("usage state file %s: %s", self.path, "on disk, writes are fsync'ed" if self._sync
                     else "in memory (tmpfs), writes are renamed without fsync")
        return self._sync

    def write(self, state: UsageState) -> None:
        """Replace the file with ``state`` (:func:`~gpupool.files.replace.replace_file`: temp file,
        [fsync,] rename[, fsync of the directory]); mode 0644, readable by node tools."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(self.path, encode_state(state), mode=_MODE, durable=self.sync)

    def load(self) -> UsageState | None:
        """The stored state; ``None`` when there is none or it cannot be read (reason logged)."""
        try:
            content = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.error("cannot read the usage state file %s (%s); starting from an empty state",
                      self.path, exc.strerror)
            return None
        try:
            return decode_state(content)
        except StateFileError as exc:
            aside = self.path.with_name(self.path.name + CORRUPT_SUFFIX)
            log.error("usage state file %s is unreadable (%s); moved to %s, starting from an empty state",
                      self.path, exc, aside)
            try:
                os.replace(self.path, aside)
            except OSError as move_error:
                log.error("could not move %s aside: %s", self.path, move_error.strerror)
            return None
