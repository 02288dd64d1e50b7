"""The node agent's start-up checks as its Node carries them, read for ``inspect`` and ``why``.

The agent writes one line per start (``gpupool.nodeagent.selfcheck.checks_annotation``:
``<time> at start: 5 ok, 1 warn; warn refusal at open: ...``) under the contract's
:data:`~gpupool.api.cluster_settings.AGENT_CHECKS_ANNOTATION`. The plugin may not import the node
agent (``.importlinter``: products share only the contract), so the one rule it needs (is any check
not ok?) lives here; a test holds it to the agent's writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.api.cluster_settings import AGENT_CHECKS_ANNOTATION

_NOT_OK = (" warn", " fail")
"""Count words of the summary's head that mean a check was not ok (``1 warn``, ``2 fail``)."""


def checks_trouble(node: Mapping[str, Any]) -> str | None:
    """The node's start-up checks' summary when any check was not ok, else None (all ok, or an agent
    that wrote none)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(AGENT_CHECKS_ANNOTATION)
    if not isinstance(value, str) or not value.strip():
        return None
    counts = value.split(" at start: ", 1)[-1].split(";", 1)[0]
    return value.strip() if any(word in f" {counts}" for word in _NOT_OK) else None
