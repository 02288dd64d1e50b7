"""The contract between the node agent and the GPU server of remote shares: the clients file.

The node agent of a GPU node writes, atomically (written beside it, then renamed), the file the
GPU server (``gpupool remote-gpu serve --clients FILE``) reads to learn whom it serves::

    {"version": 1,
     "clients": [{"token": "<opaque, >= 32 URL-safe characters>", "pod": "ns/name",
                  "card_uuid": "GPU-...", "memory_mib": 4096, "compute_percent": 30}]}

The server re-reads the file when it changes: a client whose entry vanished is disconnected and
everything it held on the card is released. A token is the only credential a client presents, so
it must be long and random; the codec refuses short tokens and duplicates (two clients with one
token would share a booking). ``compute_percent`` 0 means no compute limit, as in local grants.

A client booked on several cards of the node (``gpu-shared: n`` with a remote share: the same
slice on each) is written with ``"card_uuids": ["GPU-a", "GPU-b"]`` instead of ``"card_uuid"``,
in the order its devices are numbered; ``memory_mib`` and ``compute_percent`` hold on each card.
A one-card client is still written with ``"card_uuid"``, so files written before several cards
(and servers reading them) are unchanged; this reader takes either form.

The client side reads two keys of the node's grant file
(:class:`gpupool.api.shim_contract.NodeGrant`): ``remote_endpoint=host:port`` and
``remote_token=<token>``. See docs/remote-gpu.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpupool.api.remote_share import MAX_REMOTE_CARDS

CLIENTS_FILE_VERSION = 1
MIN_TOKEN_CHARS = 32
MAX_TOKEN_CHARS = 256
MAX_CLIENTS = 4096
_TOKEN = re.compile(rf"^[A-Za-z0-9_-]{{{MIN_TOKEN_CHARS},{MAX_TOKEN_CHARS}}}$")
_POD = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_CARD_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
MAX_MEMORY_MIB = 1 << 30
MAX_CARDS = MAX_REMOTE_CARDS
"""The most cards one client may be booked on: ``remote-share-v1``'s limit."""


class ClientsFileError(ValueError):
    """A clients file that does not follow the contract; the message says what is wrong."""


@dataclass(frozen=True)
class RemoteClient:
    """One client the GPU server serves: its token, pod, card(s) and booked share (per card)."""

    token: str
    pod: str
    """``namespace/name``."""
    card_uuid: str
    """The first card: the client's device 0."""
    memory_mib: int
    compute_percent: int
    """0 to 100; 0 is no compute limit."""
    more_card_uuids: tuple[str, ...] = ()
    """The client's devices 1, 2, ...: further cards of this node holding the same slice."""

    @property
    def card_uuids(self) -> tuple[str, ...]:
        """Every card of the client, in the order of its devices."""
        return (self.card_uuid, *self.more_card_uuids)

    def __post_init__(self) -> None:
        check_client(self)


def check_client(client: RemoteClient) -> None:
    """Raise :class:`ClientsFileError` for a client the server must not serve (the token is never
    shown in the message)."""
    if not isinstance(client.token, str) or not _TOKEN.match(client.token):
        raise ClientsFileError(f"client {client.pod!r}: token must be {MIN_TOKEN_CHARS}-{MAX_TOKEN_CHARS} "
                               "URL-safe characters (A-Z a-z 0-9 - _)")
    if not isinstance(client.pod, str) or not _POD.match(client.pod):
        raise ClientsFileError(f"client pod {client.pod!r}: expected namespace/name")
    if not isinstance(client.more_card_uuids, tuple) or len(client.more_card_uuids) >= MAX_CARDS:
        raise ClientsFileError(f"client {client.pod}: at most {MAX_CARDS} cards")
    for uuid in client.card_uuids:
        if not isinstance(uuid, str) or not _CARD_UUID.match(uuid):
            raise ClientsFileError(f"client {client.pod}: card_uuid {uuid!r} is not a card UUID")
    if len(set(client.card_uuids)) != len(client.card_uuids):
        raise ClientsFileError(f"client {client.pod}: a card is listed twice")
    for key, value, high in (("memory_mib", client.memory_mib, MAX_MEMORY_MIB),
                             ("compute_percent", client.compute_percent, 100)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
            raise ClientsFileError(f"client {client.pod}: {key} must be an integer 0..{high}, got {value!r}")
    if client.memory_mib == 0:
        raise ClientsFileError(f"client {client.pod}: memory_mib must be at least 1")


def encode_clients(clients: Iterable[RemoteClient]) -> str:
    """The clients file's text (sorted keys, one trailing newline)."""
    listed = list(clients)
    _check_unique(listed)
    body = [{"token": c.token, "pod": c.pod, "memory_mib": c.memory_mib, "compute_percent": c.compute_percent,
             **({"card_uuids": list(c.card_uuids)} if c.more_card_uuids else {"card_uuid": c.card_uuid})}
            for c in listed]
    return json.dumps({"version": CLIENTS_FILE_VERSION, "clients": body}, indent=1, sort_keys=True) + "\n"


def decode_clients(text: str) -> list[RemoteClient]:
    """The clients a file names; :class:`ClientsFileError` saying why when it does not follow the
    contract (the server then keeps serving the clients of the last file it could read)."""
    try:
        document: Any = json.loads(text)
    except ValueError as exc:
        raise ClientsFileError(f"clients file is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ClientsFileError("clients file must be a JSON object")
    if document.get("version") != CLIENTS_FILE_VERSION:
        raise ClientsFileError(f"clients file version {document.get('version')!r}: this reader knows "
                               f"{CLIENTS_FILE_VERSION}")
    entries = document.get("clients")
    if not isinstance(entries, list):
        raise ClientsFileError("clients file: 'clients' must be a list")
    if len(entries) > MAX_CLIENTS:
        raise ClientsFileError(f"clients file: {len(entries)} clients, at most {MAX_CLIENTS}")
    found: list[RemoteClient] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ClientsFileError(f"clients[{index}] must be an object")
        missing = [k for k in ("token", "pod", "memory_mib", "compute_percent") if k not in entry]
        if ("card_uuid" in entry) == ("card_uuids" in entry):
            missing.append("card_uuid (or card_uuids, not both)")
        if missing:
            raise ClientsFileError(f"clients[{index}]: missing {', '.join(missing)}")
        uuids = entry["card_uuids"] if "card_uuids" in entry else [entry["card_uuid"]]
        if not isinstance(uuids, list) or not uuids:
            raise ClientsFileError(f"clients[{index}]: card_uuids must be a list of card UUIDs")
        found.append(RemoteClient(token=entry["token"], pod=entry["pod"], card_uuid=uuids[0],
                                  more_card_uuids=tuple(uuids[1:]), memory_mib=entry["memory_mib"],
                                  compute_percent=entry["compute_percent"]))
    _check_unique(found)
    return found


def _check_unique(clients: list[RemoteClient]) -> None:
    seen: set[str] = set()
    for client in clients:
        if client.token in seen:
            raise ClientsFileError(f"client {client.pod}: its token is also another client's")
        seen.add(client.token)


# ------------------------------------------------------------------------------ the client's side
GRANT_REMOTE_ENDPOINT = "remote_endpoint"
"""Grant-file key: ``host:port`` of the GPU server (``[v6addr]:port`` for IPv6)."""
GRANT_REMOTE_TOKEN = "remote_token"
"""Grant-file key: the client's token, as in the server's clients file."""


def parse_endpoint(value: str, *, any_port: bool = False) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) split; :class:`ValueError` saying why otherwise.
    ``any_port``: port 0 is allowed (a listen address: any free port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 if any_port else 1) <= int(port) < 65536:
        raise ValueError(f"endpoint {value!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)
