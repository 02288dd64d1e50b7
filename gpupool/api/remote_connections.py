"""The GPU server's connections file: which remote clients are connected now, for the node agent.

``gpupool remote-gpu serve --status FILE`` rewrites ``FILE`` (atomically) whenever the set of its
authenticated client connections changes, and empties it when it stops:
``{"version": 1, "connections": [{"pod": "ns/name", "card_uuid": "GPU-...", "connections": 2}]}``,
one entry per pod and card with at least one live connection (a client program opens one
connection per process). No token is ever written: the node agent reports this file on ``/usage``
and ``/metrics``. The node agent has the server write it beside its clients file under
:data:`CONNECTIONS_FILE`.
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


def encode_connections(entries: Iterable[ClientConnections]) -> str:
    """The file's text, entries sorted by pod and card."""
    body = [{"pod": e.pod, "card_uuid": e.card_uuid, "connections": e.connections}
            for e in sorted(entries, key=lambda e: (e.pod, e.card_uuid))]
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
        found.append(ClientConnections(pod, card, count))
    return tuple(found)
