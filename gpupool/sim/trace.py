"""Reading cluster and pod lists (the openb CSV format) into core types.

Bundled names (``default``, ``gpushare40``, ``multigpu20``, ``gpuspec10``, ``cpu050``) resolve to the
copies of Alibaba's trace shipped in ``gpupool/data/openb`` (see its ATTRIBUTION.md); anything else
is read as a path.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TextIO

from gpupool.core.model import ContainerRequest, GpuCard, GpuRequest, NodeSpec, PodRequest

BUNDLED_TRACES = ("default", "gpushare40", "multigpu20", "gpuspec10", "cpu050")
BUNDLED_NODES = "openb"

CARD_MEMORY_MIB = {
    "P100": 16_384,
    "T4": 16_384,
    "V100M16": 16_384,
    "V100M32": 32_768,
    "A10": 24_576,
    "G2": 16_384,
    "G3": 32_768,
}
"""Memory per card by model. The trace anonymises G2/G3 and states no memory; since trace requests
take memory in proportion to compute, these values never change a trace decision."""
DEFAULT_CARD_MEMORY_MIB = 16_384


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, line and column."""


@dataclass(frozen=True)
class TracePod:
    """A pod of the trace: its request plus the times the time-replay mode uses, and its QoS class
    (``LS``, ``BE``, ...; the tenant of a replay with tenants)."""

    request: PodRequest
    creation_time: int
    deletion_time: int | None
    qos: str = ""


def _data_file(name: str) -> Path:
    return Path(str(resources.files("gpupool") / "data" / "openb" / name))


def resolve_trace(name_or_path: str) -> Path:
    """The pod list for a bundled name or a path."""
    if name_or_path in BUNDLED_TRACES:
        return _data_file(f"openb_pod_list_{name_or_path}.csv")
    path = Path(name_or_path)
    if not path.is_file():
        raise TraceError(f"no bundled trace or file named {name_or_path!r}; bundled: {', '.join(BUNDLED_TRACES)}")
    return path


def resolve_nodes(name_or_path: str) -> Path:
    """The node list for the bundled name ``openb`` or a path."""
    if name_or_path in (BUNDLED_NODES, "default"):
        return _data_file("openb_node_list_gpu_node.csv")
    path = Path(name_or_path)
    if not path.is_file():
        raise TraceError(f"no bundled node list or file named {name_or_path!r}; bundled: {BUNDLED_NODES}")
    return path


def _int(row: dict[str, str], column: str, path: Path, line: int, default: int | None = None) -> int:
    raw = (row.get(column) or "").strip()
    if raw == "" and default is not None:
        return default
    try:
        return int(float(raw))
    except (ValueError, OverflowError):
        raise TraceError(f"{path}:{line}: column {column!r} must be a number, got {raw!r}") from None


def load_nodes(path: Path) -> list[NodeSpec]:
    """Nodes from a CSV with columns sn, cpu_milli, memory_mib, gpu, model[, gpu_memory_mib].

    A card's memory is ``gpu_memory_mib`` where the row gives it (``gpupool simulate export`` writes
    it), else the model's from :data:`CARD_MEMORY_MIB`."""
    nodes: list[NodeSpec] = []
    with path.open(newline="") as handle:
        for line, row in enumerate(_records(handle), start=2):
            name = (row.get("sn") or "").strip()
            if not name:
                raise TraceError(f"{path}:{line}: node without a name (column 'sn')")
            model = (row.get("model") or "").strip()
            count = _int(row, "gpu", path, line, default=0)
            memory = _int(row, "gpu_memory_mib", path, line, default=0)
            if memory < 0:
                raise TraceError(f"{path}:{line}: column 'gpu_memory_mib' must not be negative, got {memory}")
            memory = memory or CARD_MEMORY_MIB.get(model, DEFAULT_CARD_MEMORY_MIB)
            cards = tuple(GpuCard(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=memory)
                          for i in range(count))
            nodes.append(NodeSpec(name=name, cpu_milli=_int(row, "cpu_milli", path, line),
                                  memory_mib=_int(row, "memory_mib", path, line), cards=cards,
                                  labels={"gpupool.io/gpu-model": model} if model else {}))
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def _records(handle: TextIO) -> Iterator[dict[str, str]]:
    """The CSV's rows as column -> text, as :class:`csv.DictReader` gives them (blank rows skipped,
    missing cells absent), without its cost per row: on the default trace it was a third of reading
    it, and a one-seed replay reads it every time."""
    reader = csv.reader(handle)
    header = next(reader, [])
    for row in reader:
        if row:
            yield dict(zip(header, row, strict=False))  # short rows: missing cells, as DictReader


def load_pods(path: Path) -> list[TracePod]:
    """Pods from a CSV with columns name, cpu_milli, memory_mib, num_gpu, gpu_milli[, gpu_spec, ...]."""
    pods: list[TracePod] = []
    requests: dict[tuple[int, int, str], GpuRequest] = {}  # requests are immutable: one per shape
    with path.open(newline="") as handle:
        for line, row in enumerate(_records(handle), start=2):
            name = (row.get("name") or "").strip()
            if not name:
                raise TraceError(f"{path}:{line}: pod without a name (column 'name')")
            count = _int(row, "num_gpu", path, line, default=0)
            milli = min(_int(row, "gpu_milli", path, line, default=0), 1000)
            gpu = None
            if count > 0 and milli > 0:
                spec = row.get("gpu_spec") or ""
                gpu = requests.get((milli, count, spec))
                if gpu is None:
                    models = frozenset(m for m in spec.split("|") if m)
                    gpu = requests[(milli, count, spec)] = GpuRequest.fraction(milli, count, models)
            container = ContainerRequest(name="main", cpu_milli=_int(row, "cpu_milli", path, line),
                                         memory_mib=_int(row, "memory_mib", path, line), gpu=gpu)
            deletion = (row.get("deletion_time") or "").strip()
            pods.append(TracePod(
                request=PodRequest(key=name, containers=(container,)),
                creation_time=_int(row, "creation_time", path, line, default=0),
                deletion_time=int(float(deletion)) if deletion else None,
                qos=(row.get("qos") or "").strip(),
            ))
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods
