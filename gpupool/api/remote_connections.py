"""The GPU server's connections file: which remote clients are connected now, for the node agent.

``gpupool remote-gpu serve --status FILE`` rewrites ``FILE`` (atomically) whenever the set of its
authenticated client connections changes, and empties it when it stops:
``{"version": 1, "connections": [{"pod": "ns/name", "card_uuid": "GPU-...", "connections": 2}]}``,
one entry per pod and card with at least one live connection (a client program opens one
connection per process). No token is ever written: the node agent reports this file on ``/usage``
and ``/metrics``. The node agent has the server write it beside its clients file under
:data:`CONNECTIONS_FILE`.

What each client uses now, summed over its connections (optional keys: a server older than them
writes none, and a reader of this version that does not know them ignores them):
``"memory_used_bytes"``, the bytes its live allocations hold on the card (what its memory limit
counts); ``"connected_since"``, when its oldest live connection was authenticated (unix seconds);
``"sm_percent"``, its SM use as the interception library measured it, only where the server runs
the client under the library with a compute share (``--enforce-compute``), absent otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

CONNECTIONS_FILE_VERSION = 1
CONNECTIONS_FILE = "remote-gpu-connections.json"
"""The file's name in the node agent's state directory, beside the clients file."""


class ConnectionsFileError(ValueError):
    """The text is not a connections file of this version."""


@dataclass(frozen=True)
class ClientConnections:
    """How many live connections a client pod has to its share on one card."""

    pod: str
    """``namespace/name``."""
    card_uuid: str
    connections: int
    memory_used_bytes: int | None = None
    """Bytes the client's live allocations hold on the card, all its connections together (None:
    the server did not say)."""
    connected_since: int | None = None
    """Unix seconds: when the oldest of its live connections was authenticated (None: not said)."""
    sm_percent: int | None = None
    """Its SM use in per cent of the card, all connections together, where measured (None: not)."""


_OPTIONAL = ("memory_used_bytes", "connected_since", "sm_percent")


def encode_connections(entries: Iterable[ClientConnections]) -> str:
    """The file's text, entries sorted by pod and card; a figure not known is left out."""
    body = []
    for e in sorted(entries, key=lambda e: (e.pod, e.card_uuid)):
        entry: dict[str, object] = {"pod": e.pod, "card_uuid": e.card_uuid, "connections": e.connections}
        entry.update({key: getattr(e, key) for key in _OPTIONAL if getattr(e, key) is not None})
        body.append(entry)
    return json.dumps({"version": CONNECTIONS_FILE_VERSION, "connections": body}, sort_keys=True) + "\n"


def decode_connections(text: str) -> tuple[ClientConnections, ...]:
    """The entries of a connections file; :class:`ConnectionsFileError` saying what is wrong."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConnectionsFileError(f"not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("version") != CONNECTIONS_FILE_VERSION:
        raise ConnectionsFileError(f"expected an object with version {CONNECTIONS_FILE_VERSION}")
    entries = document.get("connections")
    if not isinstance(entries, list):
        raise ConnectionsFileError("connections: expected a list")
    found = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise ConnectionsFileError("connections: expected objects")
        pod, card, count = entry.get("pod"), entry.get("card_uuid"), entry.get("connections")
        if not isinstance(pod, str) or not isinstance(card, str) or type(count) is not int or count < 1:
            raise ConnectionsFileError(f"connections: bad entry {entry!r}")
        figures = {key: entry.get(key) for key in _OPTIONAL}
        if any(v is not None and (type(v) is not int or v < 0) for v in figures.values()):
            raise ConnectionsFileError(f"connections: bad figure in {entry!r}")
        found.append(ClientConnections(pod, card, count, **figures))
    return tuple(found)
