"""The node agent's usage report: what its usage monitor measures, as JSON for other components.

Why in the contract: the node agent writes it (``GET /usage.json`` on its metrics port) and the
kubectl plugin reads it through the API server's node proxy; neither product may import the other,
so the document and its codec live here, like the annotations. ``/usage`` shows the same as text
for people; scripts and the plugin read this one instead of parsing a table.

Version 1::

    {"v": 1, "node": "n1", "source": "proc-scan", "idleAfterSeconds": 600.0,
     "cards": [{"index": 0, "uuid": "GPU-...", "model": "Tesla-T4", "state": "busy",
                "utilizationPercent": 50, "memoryUsedMiB": 3500, "memoryTotalMiB": 16384,
                "holders": 1, "idleSeconds": 0.0}],
     "containers": [{"namespace": "ml", "pod": "job-0", "container": "train", "card": 0,
                     "memoryUsedMiB": 3000, "memoryLimitMiB": 4096, "smPercent": 40,
                     "computeSharePercent": 30, "processes": 1}]}

``utilizationPercent`` and ``memoryUsedMiB`` are null when the last sample lacked the card (an NVML
error); a reader shows them as unknown, never as 0.

Where the interception library runs, a container row also carries its heartbeat (docs/isolation.md,
"Heartbeat: renewals"): ``"heartbeatAgeSeconds"``, how long ago its least recently renewed
registered process renewed, and ``"heartbeatStale"``, whether that is past the stale age. Both are
optional (absent on nodes without the library, and from older agents); a reader that does not know
them skips them.

A container whose share came from DRA claims the node's driver prepared (docs/dra.md) carries
``"claims"``, the names of those ResourceClaims in the pod's namespace (optional: absent for a
grant by the pod's assignment, and from older agents); its limits are the claims' shares on the
card, summed when it uses several there.

A card some infrastructure holder keeps open (a host daemon such as nvidia-persistenced, or a
process of a pod that asked for no GPU in an infrastructure namespace such as the GPU Operator's DCGM
exporter; counted in ``holders`` but neither making the card busy nor keeping it from being lent:
docs/monitor.md, "Infrastructure holders") also carries ``"infrastructureHolders"``, how many of its
holders are infrastructure (optional: absent when none, and from older agents). An infrastructure
pod has no container row.

A node whose GPU server serves remote shares (docs/remote-gpu.md) also lists its remote clients,
pods of other nodes with a share booked on one of its cards (optional: absent when there is none,
and from older agents)::

     "remoteClients": [{"namespace": "ml", "pod": "train-0", "card": 1, "uuid": "GPU-...",
                        "memoryLimitMiB": 4096, "computeSharePercent": 25, "connections": 2}]

``card`` is -1 for a uuid the node does not have; ``connections`` (live connections to the
server) is null while the server has not reported them.

What a connected client uses now, as the GPU server reports it (optional, each absent where the
server did not say: no live connection, not measured, or an older agent or server):
``"memoryUsedMiB"``, what its live allocations hold on the card (MiB, rounded up: what its memory
limit counts, not the context's own overhead); ``"connectedSince"``, when its oldest live
connection was authenticated (RFC 3339, UTC); ``"smPercent"``, its SM use in per cent of the card,
only where the server runs it under the interception library with a compute share
(docs/remote-gpu.md, "What a client uses").

The report is de-sensitised (docs/monitor.md, "What the control center sees"): names of pods and
containers, figures and counts, never a process's name, command line, environment, a host path or
a pid.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpupool.api.fields import SCHEMA_VERSION, AnnotationError, field, format_time, load_document, parse_time

USAGE_REPORT_PATH = "usage.json"
"""Where the node agent serves the report, on its metrics port (``/usage.json``)."""

CARD_STATES = ("free", "busy", "idle")
_WHAT = "usage report"


@dataclass(frozen=True)
class CardUsageReport:
    """One card: its sampled use (None: not in the last sample), recorded state and holders."""

    index: int
    uuid: str
    model: str
    state: str
    utilization_percent: int | None
    memory_used_mib: int | None
    memory_total_mib: int
    holders: int
    idle_seconds: float
    infrastructure_holders: int = 0
    """How many of ``holders`` are infrastructure (host daemons, infrastructure pods: no work on the card)."""


@dataclass(frozen=True)
class ContainerUsageReport:
    """One pod container on one card: what its processes use against what its grant allows."""

    namespace: str
    pod: str
    container: str
    card: int
    memory_used_mib: int
    memory_limit_mib: int
    sm_percent: int
    compute_share_percent: int
    processes: int
    heartbeat_age_seconds: float | None = None
    heartbeat_stale: bool | None = None
    claims: tuple[str, ...] = ()
    """The prepared DRA ResourceClaims (in the pod's namespace) its grant on the card came from;
    empty for a grant by the pod's assignment (the device plugin's)."""


@dataclass(frozen=True)
class RemoteClientUsageReport:
    """One remote client: a pod of another node and the share booked for it on this node's card."""

    namespace: str
    pod: str
    card: int
    uuid: str
    memory_limit_mib: int
    compute_share_percent: int
    connections: int | None
    memory_used_mib: int | None = None
    """What its live allocations hold on the card (None: not reported)."""
    connected_since: dt.datetime | None = None
    """When its oldest live connection was authenticated (None: not reported)."""
    sm_percent: int | None = None
    """Its SM use, where the server measures it (None: not measured)."""


@dataclass(frozen=True)
class NodeUsageReport:
    """Everything one agent's usage monitor reports."""

    node: str
    source: str
    idle_after_seconds: float
    cards: tuple[CardUsageReport, ...]
    containers: tuple[ContainerUsageReport, ...]
    remote_clients: tuple[RemoteClientUsageReport, ...] = ()


_CARD_FIELDS = (("index", "index", int), ("uuid", "uuid", str), ("model", "model", str), ("state", "state", str),
                ("utilization_percent", "utilizationPercent", (int, type(None))),
                ("memory_used_mib", "memoryUsedMiB", (int, type(None))), ("memory_total_mib", "memoryTotalMiB", int),
                ("holders", "holders", int), ("idle_seconds", "idleSeconds", (int, float)))
_CARD_OPTIONAL_FIELDS = (("infrastructure_holders", "infrastructureHolders", int),)
"""Optional card fields: read when present."""
_CONTAINER_FIELDS = (("namespace", "namespace", str), ("pod", "pod", str), ("container", "container", str),
                     ("card", "card", int), ("memory_used_mib", "memoryUsedMiB", int),
                     ("memory_limit_mib", "memoryLimitMiB", int), ("sm_percent", "smPercent", int),
                     ("compute_share_percent", "computeSharePercent", int), ("processes", "processes", int))
_HEARTBEAT_FIELDS = (("heartbeat_age_seconds", "heartbeatAgeSeconds", (int, float)),
                     ("heartbeat_stale", "heartbeatStale", bool))
"""Optional container fields: read when present."""
_REMOTE_FIELDS = (("namespace", "namespace", str), ("pod", "pod", str), ("card", "card", int), ("uuid", "uuid", str),
                  ("memory_limit_mib", "memoryLimitMiB", int), ("compute_share_percent", "computeSharePercent", int),
                  ("connections", "connections", (int, type(None))))
_REMOTE_USE_FIELDS = (("memory_used_mib", "memoryUsedMiB", int), ("sm_percent", "smPercent", int))
"""Optional remote client fields: read when present (``connectedSince`` too, a time)."""


def encode_usage_report(report: NodeUsageReport) -> str:
    """The report as JSON text."""
    doc: dict[str, Any] = {
        "v": SCHEMA_VERSION, "node": report.node, "source": report.source,
        "idleAfterSeconds": report.idle_after_seconds,
        "cards": [_card_doc(card) for card in report.cards],
        "containers": [_container_doc(c) for c in report.containers],
    }
    if report.remote_clients:
        doc["remoteClients"] = [_remote_doc(r) for r in report.remote_clients]
    return json.dumps(doc)


def _remote_doc(row: RemoteClientUsageReport) -> dict[str, Any]:
    doc = {key: getattr(row, attr) for attr, key, _ in _REMOTE_FIELDS}
    doc.update({key: getattr(row, attr) for attr, key, _ in _REMOTE_USE_FIELDS if getattr(row, attr) is not None})
    if row.connected_since is not None:
        doc["connectedSince"] = format_time(row.connected_since)
    return doc


def _read_remote(item: Any, where: str) -> RemoteClientUsageReport:
    fields = _read(item, _REMOTE_FIELDS, where)
    since = item.get("connectedSince")
    if since is not None:
        fields["connected_since"] = parse_time(field(item, "connectedSince", str, where), f"{where}.connectedSince")
    return RemoteClientUsageReport(**fields, **_optional(item, _REMOTE_USE_FIELDS, where))


def _card_doc(card: CardUsageReport) -> dict[str, Any]:
    doc = {key: getattr(card, attr) for attr, key, _ in _CARD_FIELDS}
    if card.infrastructure_holders:
        doc["infrastructureHolders"] = card.infrastructure_holders
    return doc


def _container_doc(row: ContainerUsageReport) -> dict[str, Any]:
    doc = {key: getattr(row, attr) for attr, key, _ in _CONTAINER_FIELDS}
    for attr, key, _ in _HEARTBEAT_FIELDS:
        if getattr(row, attr) is not None:
            doc[key] = getattr(row, attr)
    if row.claims:
        doc["claims"] = list(row.claims)
    return doc


def _read_container(item: Any, where: str) -> ContainerUsageReport:
    row = ContainerUsageReport(**_read(item, _CONTAINER_FIELDS, where), **_optional(item, _HEARTBEAT_FIELDS, where))
    if "claims" not in item:
        return row
    claims: list[Any] = field(item, "claims", list, where)
    if not all(isinstance(name, str) and name for name in claims):
        raise AnnotationError(f"{where}.claims: expected a list of claim names, got {claims!r}")
    return replace(row, claims=tuple(claims))


def decode_usage_report(text: str) -> NodeUsageReport:
    """Read a report; :class:`AnnotationError` names the first field that breaks the schema."""
    doc = load_document(text, _WHAT)
    cards = tuple(CardUsageReport(**_read(item, _CARD_FIELDS, f"{_WHAT}.cards[{i}]"),
                                  **_optional(item, _CARD_OPTIONAL_FIELDS, f"{_WHAT}.cards[{i}]"))
                  for i, item in enumerate(_items(doc, "cards")))
    for i, card in enumerate(cards):
        if card.state not in CARD_STATES:
            raise AnnotationError(f"{_WHAT}.cards[{i}].state: one of {', '.join(CARD_STATES)}, got {card.state!r}")
    containers = tuple(_read_container(item, f"{_WHAT}.containers[{i}]")
                       for i, item in enumerate(_items(doc, "containers")))
    remote = tuple(_read_remote(item, f"{_WHAT}.remoteClients[{i}]")
                   for i, item in enumerate(_items(doc, "remoteClients") if "remoteClients" in doc else []))
    return NodeUsageReport(node=field(doc, "node", str, _WHAT), source=field(doc, "source", str, _WHAT),
                           idle_after_seconds=float(field(doc, "idleAfterSeconds", (int, float), _WHAT)),
                           cards=cards, containers=containers, remote_clients=remote)


def _items(doc: Mapping[str, Any], key: str) -> list[Any]:
    items: list[Any] = field(doc, key, list, _WHAT)
    return items


def _read(item: Any, fields: tuple[tuple[str, str, Any], ...], where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise AnnotationError(f"{where}: expected a JSON object, got {type(item).__name__}")
    return {attr: field(item, key, kind, where) for attr, key, kind in fields}


def _optional(item: Mapping[str, Any], fields: tuple[tuple[str, str, Any], ...], where: str) -> dict[str, Any]:
    out = {attr: field(item, key, kind, where) for attr, key, kind in fields if key in item}
    if isinstance(out.get("heartbeat_age_seconds"), int):
        out["heartbeat_age_seconds"] = float(out["heartbeat_age_seconds"])
    return out
