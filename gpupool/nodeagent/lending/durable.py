"""Writing the lending side's small JSON files so that a crash leaves the old file or the new one.

A node agent can be killed at any instruction (SIGKILL, OOM, the node losing power). The loans and
the reclaim journal are read back by the next agent, so each write is durable
(:func:`gpupool.files.replace.replace_file`: a temporary file in the same directory, flushed to
the disk, renamed over the old file, then the directory synced so that the rename itself survives
a power loss). A reader never sees half a file; at worst it sees the previous one. The files are
the agent's own: mode 0600.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gpupool.files.replace import replace_file


def write_json_atomically(path: str, doc: Any) -> None:
    """Replace ``path`` with ``doc`` as JSON, durably (its directory is created when missing)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    replace_file(path, json.dumps(doc), durable=True)
