"""What a GPU node serves remotely, for its ``/usage`` page and ``/metrics``.

The node agent with ``--remote-gpu-server`` writes the GPU server's clients file
(:mod:`gpupool.nodeagent.remote_server`): one entry per pod of another node whose remote share the
extender booked on a card of this node. The extender counts those shares in its ledger on this
node's card, so the agent reports them too: a row per remote client (its pod, card and booked
share) and their sums per card. The tokens in the file are secrets and never leave this module.

Read from the file rather than from the agent's memory so that what is reported is exactly what
the server serves (the file is rewritten on every change); an absent or unreadable file reports no
client (the server serves none either). Whether a client is connected comes from the server's
connections file beside it (:mod:`gpupool.api.remote_connections`): how many live connections
each pod has to its card, unknown (None) while that file is absent or unreadable (a server that
has not started yet, or one older than this report). The same file says what each connected client
uses now: the bytes its allocations hold on the card, since when it is connected, and its SM use
where the server measures it (under ``--enforce-compute`` with a compute share); each is None where
the server did not say (not connected, not measured, or a server older than the figure).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gpupool.api.remote_connections import (
    CONNECTIONS_FILE,
    ClientConnections,
    ConnectionsFileError,
    decode_connections,
)
from gpupool.api.remote_gpu import ClientsFileError, decode_clients
from gpupool.core.units import BYTES_PER_MIB
from gpupool.nodeagent.gpu_inventory import GpuInventory

UNKNOWN_CARD = -1
"""The card index of a client whose card uuid this node's inventory does not have."""


@dataclass(frozen=True)
class RemoteClientRow:
    """One remote client: the pod (on another node) and the share booked for it on this node's card."""

    namespace: str
    pod: str
    card: int
    """Index in this node's inventory (:data:`UNKNOWN_CARD` when the uuid is not one of its cards)."""
    uuid: str
    memory_mib: int
    compute_percent: int
    """0 to 100, rounded down from the booked per mille; 0 is no compute limit."""
    connections: int | None = None
    """The pod's live connections to the server for this card (None: the server did not say)."""
    memory_used_bytes: int | None = None
    """Bytes its live allocations hold on the card, all connections together (None: not said)."""
    connected_since: int | None = None
    """Unix seconds: when its oldest live connection was authenticated (None: not said)."""
    sm_percent: int | None = None
    """Its SM use in per cent of the card, where the server measures it (None: not measured)."""


def remote_client_rows(clients_file: Path | None, inventory: GpuInventory) -> tuple[RemoteClientRow, ...]:
    """The clients of ``clients_file`` (None: the node serves no remote share), ordered by pod and card."""
    if clients_file is None:
        return ()
    try:
        clients = decode_clients(clients_file.read_text())
    except (OSError, UnicodeDecodeError, ClientsFileError):
        return ()
    index = {card.uuid: card.index for card in inventory.cards}
    live = connected(clients_file.with_name(CONNECTIONS_FILE))
    rows = []
    for client in clients:
        namespace, _, name = client.pod.partition("/")
        # The server names a connection by its client's first card (the connection serves them all).
        entry = None if live is None else live.get((client.pod, client.card_uuid))
        count = None if live is None else entry.connections if entry is not None else 0
        for uuid in client.card_uuids:  # a client of several cards: a row per card, each booked the share
            said = entry if uuid == client.card_uuid else None  # what it uses: all its cards, on the first
            rows.append(RemoteClientRow(namespace, name, index.get(uuid, UNKNOWN_CARD), uuid,
                                        client.memory_mib, client.compute_percent, count,
                                        memory_used_bytes=said.memory_used_bytes if said is not None else None,
                                        connected_since=said.connected_since if said is not None else None,
                                        sm_percent=said.sm_percent if said is not None else None))
    return tuple(sorted(rows, key=lambda r: (r.namespace, r.pod, r.card)))


def connected(path: Path) -> dict[tuple[str, str], ClientConnections] | None:
    """The server's entry per (pod, card uuid) of the clients connected, as it last wrote them; None
    when unknown."""
    try:
        return {(e.pod, e.card_uuid): e for e in decode_connections(path.read_text())}
    except (OSError, UnicodeDecodeError, ConnectionsFileError):
        return None


@dataclass(frozen=True)
class RemoteBooked:
    """What remote clients book on one card: how many, memory and compute (per mille of the card)."""

    clients: int = 0
    memory_mib: int = 0
    compute_permille: int = 0


def remote_booked(rows: tuple[RemoteClientRow, ...]) -> dict[int, RemoteBooked]:
    """Per card index of this node, the sums of ``rows`` (clients of unknown cards are left out)."""
    sums: defaultdict[int, RemoteBooked] = defaultdict(RemoteBooked)
    for row in rows:
        if row.card == UNKNOWN_CARD:
            continue
        now = sums[row.card]
        sums[row.card] = RemoteBooked(now.clients + 1, now.memory_mib + row.memory_mib,
                                      now.compute_permille + row.compute_percent * 10)
    return dict(sums)


def remote_table(rows: tuple[RemoteClientRow, ...]) -> str:
    """The ``/usage`` page's section of remote clients (empty when there is none)."""
    if not rows:
        return ""
    lines = ["", f"{'REMOTE CLIENT NAMESPACE/POD':<48}{'CARD':>5}{'MEM BOOKED MiB':>16}{'SHARE%':>8}"
                 f"{'CONNECTIONS':>13}{'MEM USED MiB':>14}{'SM%':>5}  CONNECTED SINCE"]
    for r in rows:
        card = "?" if r.card == UNKNOWN_CARD else str(r.card)
        share = str(r.compute_percent) if r.compute_percent else "-"
        live = "?" if r.connections is None else str(r.connections)
        used = "-" if r.memory_used_bytes is None else str(used_mib(r.memory_used_bytes))
        sm = "-" if r.sm_percent is None else str(r.sm_percent)
        since = "-" if r.connected_since is None else f"{since_time(r.connected_since):%Y-%m-%dT%H:%M:%SZ}"
        lines.append(f"{f'{r.namespace}/{r.pod}'[:47]:<48}{card:>5}{r.memory_mib:>16}{share:>8}{live:>13}"
                     f"{used:>14}{sm:>5}  {since}")
    return "\n".join(lines) + "\n"


def used_mib(used_bytes: int) -> int:
    """Bytes as whole MiB, rounded up: a client that holds anything never reads as holding nothing."""
    return -(-used_bytes // BYTES_PER_MIB)


def since_time(unix_seconds: int) -> dt.datetime:
    """The server's unix seconds as an aware UTC time."""
    return dt.datetime.fromtimestamp(unix_seconds, dt.UTC)
