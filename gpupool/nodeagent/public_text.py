"""Free text the node agent shows the control center, with the host's particulars taken out.

What ``/usage``, ``/usage.json`` and ``/metrics`` carry is de-sensitised by construction (docs/monitor.md,
"What the control center sees"): figures, the pods' own names and the cards' identities, never a
process's name, command line or environment, nor a pid. The one place free text reaches them is a
reason a backend or a kernel gave (an isolation backend's detail, a ``dmem`` write that failed): those
can name host paths (the library's location, a cgroup directory) and a daemon's pid. :func:`public`
replaces each absolute path with ``<path>`` and each ``pid N`` with ``pid ?``; the agent's log keeps
the full text for the node's admin.
"""

from __future__ import annotations

import re

_QUOTED_PATH = re.compile(r"""(['"])/[^'"\n]*\1""")
"""A quoted absolute path (as Python's OSError writes one), spaces and all."""
_PATH = re.compile(r"(?<![\w/.~-])/[^\s'\",;:()\[\]{}<>]*")
"""An absolute path: a slash not inside a word or a relative path (``drm/0000:3b:00.0`` is a name)."""
_PID = re.compile(r"\b(pids?)\s+\d+")


def public(text: str) -> str:
    """``text`` without host paths or pids."""
    return _PID.sub(r"\1 ?", _PATH.sub("<path>", _QUOTED_PATH.sub(r"\1<path>\1", text)))
