"""The per-node state file: written atomically, read back after a restart, never fatal when bad.

Default path :data:`DEFAULT_STATE_PATH`, on a hostPath volume so that it outlives the agent's pod.
A write goes to a temporary file in the same directory, is fsync'ed, renamed over the old file, and
the directory is fsync'ed: a reader (or the agent after a crash or power loss) sees the old state or
the new one, never a mix. A file that is nevertheless torn or corrupt (a disk error, a hand edit) is
moved aside as ``<name>.corrupt`` with a logged reason and the agent starts from an empty state.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gpupool.nodeagent.monitor.state_codec import StateFileError, decode_state, encode_state
from gpupool.nodeagent.monitor.usage_state import UsageState

log = logging.getLogger(__name__)

DEFAULT_STATE_PATH = "/var/lib/gpupool/monitor/state.json"
CORRUPT_SUFFIX = ".corrupt"
_TEMP_SUFFIX = ".tmp"


class StateFile:
    """Reads and atomically replaces one state file.

    ``sync=False`` skips both fsyncs: the rename alone is atomic for every process that reads the
    file, so an agent restart still finds the old or the new state; only a power loss may lose the
    last writes, after which no recorded holder is alive anyway. For a file on tmpfs (``/run``),
    or where the disk's fsync latency is too high (docs/monitor.md, "Measurements").
    """

    def __init__(self, path: str | os.PathLike[str] = DEFAULT_STATE_PATH, *, sync: bool = True) -> None:
        self.path = Path(path)
        self.sync = sync

    def write(self, state: UsageState) -> None:
        """Replace the file with ``state`` (temp file, fsync, rename, fsync of the directory)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(self.path.name + _TEMP_SUFFIX)
        with open(temp, "wb") as fh:
            fh.write(encode_state(state))
            fh.flush()
            if self.sync:
                os.fsync(fh.fileno())
        os.replace(temp, self.path)
        if not self.sync:
            return
        directory = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

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
