"""The state file's JSON form, version 1, and its strict reader.

Format::

    {"schema": "gpupool.io/usage-state", "version": 1, "node": "n1", "updated": 1700000000.5,
     "devices": [{"path": "/dev/nvidia0", "state": "busy", "lastUse": 1700000000.1,
                  "holders": [{"pid": 4242, "startTime": 981234, "since": 1699999990.0,
                               "containerId": "0f3c...", "container": "train", "pod": "job-0",
                               "namespace": "ml", "priority": null, "infrastructure": ""}]}]}

``infrastructure`` (why the holder is infrastructure, else empty: the executable's name of a host
daemon, in no container; or, for a process of a pod, the pod's namespace, an infrastructure
namespace) may be missing: a file written before it existed reads as empty. ``undecided`` is written
only when true (a pod's process recorded before the pod watch listed, where it could be
infrastructure: :attr:`~gpupool.nodeagent.monitor.usage_state.Holder.undecided`); missing reads as
false, and an agent that does not know it reads such a holder as an ordinary one.

The reader refuses anything else with :class:`StateFileError` naming the field, including a newer
version (an agent rolled back must not misread a file written by its successor).
"""

from __future__ import annotations

import json
import math
from typing import Any

from gpupool.nodeagent.monitor.usage_state import DeviceState, DeviceUsage, Holder, UsageState, counts_as_use

SCHEMA = "gpupool.io/usage-state"
VERSION = 1


class StateFileError(ValueError):
    """The state file's content is not a usage state of a version this agent reads."""


def encode_state(state: UsageState) -> bytes:
    """The file content for ``state`` (UTF-8 JSON, one line, keys in a stable order)."""
    document = {
        "schema": SCHEMA, "version": VERSION, "node": state.node, "updated": state.updated,
        "devices": [{"path": d.path, "state": d.state.value, "lastUse": d.last_use,
                     "holders": [_encode_holder(h) for h in d.holders]} for d in state.devices],
    }
    return json.dumps(document, allow_nan=False, separators=(",", ":")).encode()


def _encode_holder(holder: Holder) -> dict[str, Any]:
    encoded = {"pid": holder.pid, "startTime": holder.start_time, "since": holder.since,
               "containerId": holder.container_id, "container": holder.container, "pod": holder.pod,
               "namespace": holder.namespace, "priority": holder.priority,
               "infrastructure": holder.infrastructure}
    if holder.undecided:
        encoded["undecided"] = True
    return encoded


def decode_state(content: bytes) -> UsageState:
    """Read a state file's content; :class:`StateFileError` says what is wrong with it."""
    try:
        document = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise StateFileError(f"not JSON ({exc})") from exc
    doc = _mapping(document, "the document")
    if doc.get("schema") != SCHEMA:
        raise StateFileError(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    version = _int(doc.get("version"), "version")
    if version != VERSION:
        raise StateFileError(f"version {version} is not readable by this agent (reads {VERSION})")
    devices = _list(doc.get("devices"), "devices")
    decoded = tuple(_decode_device(raw, f"devices[{i}]") for i, raw in enumerate(devices))
    paths = [d.path for d in decoded]
    if len(set(paths)) != len(paths):
        raise StateFileError("devices: a path is listed twice")
    return UsageState(node=_str(doc.get("node"), "node"), updated=_float(doc.get("updated"), "updated"),
                      devices=decoded)


def _decode_device(raw: object, where: str) -> DeviceUsage:
    device = _mapping(raw, where)
    raw_state = device.get("state")
    if raw_state not in {s.value for s in DeviceState}:
        raise StateFileError(f"{where}.state: {raw_state!r} is not one of free, busy, idle")
    state = DeviceState(raw_state)
    last_use = device.get("lastUse")
    holders = tuple(_decode_holder(h, f"{where}.holders[{i}]")
                    for i, h in enumerate(_list(device.get("holders"), f"{where}.holders")))
    if len({h.pid for h in holders}) != len(holders):
        raise StateFileError(f"{where}.holders: a pid is listed twice")
    users = [h for h in holders if counts_as_use(h)]
    if state is DeviceState.FREE and users:
        raise StateFileError(f"{where}: state free with {len(users)} holder(s)")
    return DeviceUsage(path=_str(device.get("path"), f"{where}.path"), holders=holders,
                       last_use=None if last_use is None else _float(last_use, f"{where}.lastUse"), state=state)


def _decode_holder(raw: object, where: str) -> Holder:
    holder = _mapping(raw, where)
    priority = holder.get("priority")
    pid = _int(holder.get("pid"), f"{where}.pid")
    if pid <= 0:
        raise StateFileError(f"{where}.pid: {pid} is not a process id")
    infrastructure = _str(holder.get("infrastructure", ""), f"{where}.infrastructure")
    undecided = holder.get("undecided", False)
    if not isinstance(undecided, bool):
        raise StateFileError(f"{where}.undecided: expected true or false, got {type(undecided).__name__}")
    decoded = Holder(pid=pid, start_time=_int(holder.get("startTime"), f"{where}.startTime"),
                     since=_float(holder.get("since"), f"{where}.since"),
                     container_id=_str(holder.get("containerId"), f"{where}.containerId"),
                     container=_str(holder.get("container"), f"{where}.container"),
                     pod=_str(holder.get("pod"), f"{where}.pod"),
                     namespace=_str(holder.get("namespace"), f"{where}.namespace"),
                     priority=None if priority is None else _int(priority, f"{where}.priority"),
                     infrastructure=infrastructure, undecided=undecided)
    in_container = bool(decoded.container_id or decoded.pod)
    if undecided and not in_container:
        raise StateFileError(f"{where}: undecided holder in no container: only a pod's process can be one")
    if infrastructure and in_container and (not decoded.pod or infrastructure != decoded.namespace):
        raise StateFileError(f"{where}: infrastructure holder {infrastructure!r} in a container: only a host "
                             "process, or a pod's process marked with its pod's namespace, is one")
    return decoded


def _mapping(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StateFileError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise StateFileError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise StateFileError(f"{where}: expected a string, got {type(value).__name__}")
    return value


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StateFileError(f"{where}: expected an integer, got {type(value).__name__}")
    return value


def _float(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise StateFileError(f"{where}: expected a finite number, got {value!r}")
    return float(value)
