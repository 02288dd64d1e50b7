"""Reading the openb CSV format: bundled names, the pod and node columns, precise errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.core.model import GpuRequest
from gpupool.sim.trace import (
    BUNDLED_TRACES,
    CARD_MEMORY_MIB,
    DEFAULT_CARD_MEMORY_MIB,
    TraceError,
    load_nodes,
    load_pods,
    resolve_nodes,
    resolve_trace,
)

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time\n"


def write(tmp_path: Path, text: str, name: str = "f.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_bundled_names_resolve_to_shipped_files() -> None:
    for name in BUNDLED_TRACES:
        assert resolve_trace(name).is_file()
    assert resolve_nodes("openb") == resolve_nodes("default")
    assert resolve_nodes("openb").is_file()


def test_unknown_names_are_reported(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no bundled trace or file named 'nope'; bundled: default"):
        resolve_trace("nope")
    with pytest.raises(TraceError, match="no bundled node list or file named"):
        resolve_nodes(str(tmp_path / "missing.csv"))
    path = write(tmp_path, POD_HEADER + "p,1,1,0,0,,LS,Running,0,\n")
    assert resolve_trace(str(path)) == path


def test_load_pods(tmp_path: Path) -> None:
    path = write(tmp_path, POD_HEADER
                 + "a,4000,8192,1,460,,LS,Running,10,99\n"
                 + "b,8000,1024,2,1000,V100M16|V100M32,LS,Running,20,\n"
                 + "c,500,256,0,0,,BE,Running,30,40\n"
                 + "d,500,256,1,1500,T4,BE,Running,0,\n"
                 + "e,500,256,1,0,,BE,Running,0,\n")
    pods = {p.request.key: p for p in load_pods(path)}
    a = pods["a"].request
    assert (a.cpu_milli, a.memory_mib) == (4000, 8192)
    assert a.containers[0].gpu == GpuRequest(compute=460, memory_mib=None)
    assert (pods["a"].creation_time, pods["a"].deletion_time) == (10, 99)
    assert pods["b"].request.containers[0].gpu == GpuRequest.whole(2, frozenset({"V100M16", "V100M32"}))
    assert pods["b"].deletion_time is None
    assert pods["c"].request.containers[0].gpu is None
    assert pods["d"].request.containers[0].gpu == GpuRequest.whole(1, frozenset({"T4"}))  # clipped to 1000
    assert pods["e"].request.containers[0].gpu is None  # a GPU count without milli asks for nothing


def test_load_pods_reads_rows_as_a_dict_reader_would(tmp_path: Path) -> None:
    """Blank rows are skipped, cells missing at the end of a row are empty, and pods of one GPU
    shape share one (immutable) request."""
    path = write(tmp_path, POD_HEADER + "a,4000,8192,1,460,,LS,Running,10,99\n\n"
                 + "b,1000,1024,1,460\n" + "c,1000,1024,1,460,T4\n")
    a, b, c = load_pods(path)
    assert (b.request.key, b.creation_time, b.deletion_time, b.qos) == ("b", 0, None, "")
    assert b.request.containers[0].gpu is a.request.containers[0].gpu
    assert c.request.containers[0].gpu == GpuRequest(compute=460, memory_mib=None, models=frozenset({"T4"}))


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("", "no pods"),
        (",1,1,0,0,,LS,Running,0,\n", ":2: pod without a name"),
        ("a,1,1,0,0,,LS,Running,0,\nb,x,1,0,0,,LS,Running,0,\n", ":3: column 'cpu_milli' must be a number, got 'x'"),
    ],
)
def test_load_pods_errors_name_file_and_line(tmp_path: Path, rows: str, message: str) -> None:
    path = write(tmp_path, POD_HEADER + rows)
    with pytest.raises(TraceError, match=message) as info:
        load_pods(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("value", ["inf", "1e400"])
def test_load_pods_reports_infinite_numbers(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, POD_HEADER + f"a,{value},1,0,0,,LS,Running,0,\n")
    with pytest.raises(TraceError, match=f":2: column 'cpu_milli' must be a number, got '{value}'"):
        load_pods(path)


def test_load_nodes(tmp_path: Path) -> None:
    path = write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\n"
                           "n0,64000,262144,2,V100M32\nn1,96000,393216,8,G9\nn2,32000,131072,0,\n")
    n0, n1, n2 = load_nodes(path)
    assert (n0.name, n0.cpu_milli, n0.memory_mib, len(n0.cards)) == ("n0", 64000, 262144, 2)
    assert {c.memory_mib for c in n0.cards} == {CARD_MEMORY_MIB["V100M32"]}
    assert [c.index for c in n1.cards] == list(range(8))
    assert {c.memory_mib for c in n1.cards} == {DEFAULT_CARD_MEMORY_MIB}
    assert n1.cards[3].uuid == "GPU-n1-3"
    assert n0.labels == {"gpupool.io/gpu-model": "V100M32"}
    assert n2.cards == () and n2.labels == {}


def test_load_nodes_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=":2: node without a name"):
        load_nodes(write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\n,1,1,1,T4\n"))
    with pytest.raises(TraceError, match="no nodes"):
        load_nodes(write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\n"))


def test_bundled_cluster_size() -> None:
    nodes = load_nodes(resolve_nodes("openb"))
    assert len(nodes) == 1213
    assert sum(len(n.cards) for n in nodes) == 6212
