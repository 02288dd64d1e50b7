"""The annotation codecs: round trips, and every malformed value refused with the field named."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from gpupool.api.annotations import (
    Allocated,
    AllocatedContainer,
    AnnotationError,
    Assignment,
    CardRef,
    ContainerCards,
    Inventory,
    decode_allocated,
    decode_assignment,
    decode_inventory,
    encode_allocated,
    encode_assignment,
    encode_inventory,
)
from gpupool.core.model import (
    CardSlice,
    ContainerAssignment,
    GpuCard,
    LinkLevel,
    NodeSpec,
    Placement,
    Topology,
)

WHEN = dt.datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)


def test_inventory_round_trip_with_topology() -> None:
    cards = (GpuCard(0, "GPU-a", "A100", 40960), GpuCard(1, "GPU-b", "A100", 40960, healthy=False))
    inv = Inventory(cards, Topology.from_tree([[0, 1]], 2))
    text = encode_inventory(inv)
    assert decode_inventory(text) == inv
    assert json.loads(text)["links"] == [[0, 2], [2, 0]]


def test_inventory_cards_sorted_by_index() -> None:
    doc = {
        "v": 1,
        "cards": [
            {"index": 1, "uuid": "b", "model": "T4", "memoryMiB": 1, "healthy": True},
            {"index": 0, "uuid": "a", "model": "T4", "memoryMiB": 2, "healthy": True},
        ],
    }
    assert [c.index for c in decode_inventory(json.dumps(doc)).cards] == [0, 1]


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        pytest.param("not json", "not valid JSON", id="not-json"),
        pytest.param("[]", "expected a JSON object", id="not-an-object"),
        pytest.param({"v": 2, "cards": []}, "unsupported schema version 2", id="unknown-version"),
        pytest.param({"v": 1}, "missing field 'cards'", id="no-cards"),
        pytest.param(
            {"v": 1, "cards": [{"index": 0, "uuid": "a", "model": "T4", "memoryMiB": -1, "healthy": True}]},
            "memoryMiB: must be non-negative", id="negative-memory"),
        pytest.param(
            {
                "v": 1,
                "cards": [{"index": 0, "uuid": "a", "model": "T4", "memoryMiB": "16Gi", "healthy": True}],
            },
            "memoryMiB: expected int", id="memory-as-text"),
        pytest.param(
            {"v": 1, "cards": [{"index": 0, "uuid": "a", "model": "T4", "memoryMiB": True, "healthy": True}]},
            "got a boolean", id="memory-as-boolean"),
        pytest.param(
            {
                "v": 1,
                "cards": [
                    {"index": 0, "uuid": "a", "model": "T4", "memoryMiB": 1, "healthy": True},
                    {"index": 0, "uuid": "b", "model": "T4", "memoryMiB": 1, "healthy": True},
                ],
            },
            "appears twice", id="duplicate-index"),
        pytest.param(
            {
                "v": 1,
                "cards": [{"index": 0, "uuid": "a", "model": "T4", "memoryMiB": 1, "healthy": True}],
                "links": [[1]],
            },
            "diagonal", id="self-link"),
        pytest.param(
            {
                "v": 1,
                "cards": [
                    {"index": i, "uuid": str(i), "model": "T4", "memoryMiB": 1, "healthy": True}
                    for i in range(2)
                ],
                "links": [[0, 1], [2, 0]],
            },
            "not symmetric", id="asymmetric-links"),
        pytest.param(
            {
                "v": 1,
                "cards": [
                    {"index": 0, "uuid": "a", "model": "T4", "memoryMiB": 1, "healthy": True, "kind": "mig"}
                ],
            },
            "physical or virtual", id="unknown-kind"),
    ],
)
def test_inventory_rejects(doc: object, fragment: str) -> None:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    with pytest.raises(AnnotationError, match=fragment):
        decode_inventory(text)


def _spec() -> NodeSpec:
    return NodeSpec(
        "n1", 1000, 1000, cards=(GpuCard(0, "GPU-0", "T4", 16000), GpuCard(3, "GPU-3", "T4", 16000))
    )


def test_assignment_round_trip_and_back_to_positions() -> None:
    placement = Placement(
        "ns/p",
        "n1",
        0,
        0,
        (
            ContainerAssignment("main", (CardSlice(1, 4000, 300),)),
            ContainerAssignment("setup", (CardSlice(0, 16000, 1000, exclusive=True),), init=True),
        ),
    )
    assignment = Assignment.from_placement(placement, _spec(), WHEN)
    assert assignment.containers[0].cards[0] == CardRef(index=3, uuid="GPU-3", memory_mib=4000, compute=300)
    decoded = decode_assignment(encode_assignment(assignment))
    assert decoded == assignment
    assert decoded.to_placement("ns/p", _spec(), 0, 0) == placement


def test_assignment_refuses_a_replaced_card() -> None:
    assignment = Assignment("n1", WHEN, (ContainerCards("main", (CardRef(3, "GPU-old", 1, 0),)),))
    with pytest.raises(AnnotationError, match="no card 3 with uuid GPU-old"):
        assignment.to_placement("ns/p", _spec(), 0, 0)


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        pytest.param(lambda d: d.pop("node"), "missing field 'node'", id="no-node"),
        pytest.param(lambda d: d.update(time="yesterday"), "not an RFC 3339 time", id="unreadable-time"),
        pytest.param(
            lambda d: d["containers"][0]["cards"][0].update(computeMilli=1001), "at most 1000",
            id="compute-over-a-card",
        ),
        pytest.param(lambda d: d["containers"][0].update(cards=[]), "at least one card", id="no-cards"),
        pytest.param(
            lambda d: d["containers"].append(dict(d["containers"][0])), "appears twice",
            id="duplicate-container",
        ),
        pytest.param(
            lambda d: d["containers"][0]["cards"][0].pop("uuid"), "missing field 'uuid'",
            id="card-without-uuid",
        ),
    ],
)
def test_assignment_rejects(mutate: object, fragment: str) -> None:
    doc = json.loads(
        encode_assignment(Assignment("n1", WHEN, (ContainerCards("main", (CardRef(0, "u", 1, 2),)),)))
    )
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(AnnotationError, match=fragment):
        decode_assignment(json.dumps(doc))


def test_allocated_round_trip() -> None:
    value = Allocated("n1", WHEN)
    assert decode_allocated(encode_allocated(value)) == value
    with pytest.raises(AnnotationError):
        decode_allocated('{"v":1,"node":"n1"}')
    assert LinkLevel.SELF == 0


def test_allocated_with_containers_round_trip() -> None:
    value = Allocated("n1", WHEN, (
        AllocatedContainer("worker", (CardRef(1, "GPU-b", 4096, 300),), resources={"gpupool.io/gpu-mem": 16}),
        AllocatedContainer("warmup", (CardRef(0, "GPU-a", 512, 100),), init=True),
    ))
    text = encode_allocated(value)
    decoded = decode_allocated(text)
    assert [c.name for c in decoded.containers] == ["warmup", "worker"]  # sorted: stable rewrites
    assert {c.name: c for c in decoded.containers} == {c.name: c for c in value.containers}
    assert json.loads(text)["containers"][1]["cards"][0] == {
        "index": 1, "uuid": "GPU-b", "memoryMiB": 4096, "computeMilli": 300}


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        pytest.param(lambda d: d.update(containers={}), "containers: expected list", id="containers-not-a-list"),
        pytest.param(
            lambda d: d["containers"][0].pop("init"), r"containers\[0\]: missing field 'init'",
            id="container-without-init",
        ),
        pytest.param(
            lambda d: d["containers"][0]["cards"][0].pop("computeMilli"), "missing field 'computeMilli'",
            id="card-without-compute",
        ),
        pytest.param(
            lambda d: d["containers"][0]["resources"].update(x=-1), r"resources\.x: must be non-negative",
            id="negative-resource-count",
        ),
        pytest.param(lambda d: d.update(version=1, v=None), "unsupported schema version None", id="unknown-version"),
    ],
)
def test_allocated_rejects(mutate: object, fragment: str) -> None:
    value = Allocated("n1", WHEN, (AllocatedContainer("main", (CardRef(0, "u", 1, 2),), resources={"r": 1}),))
    doc = json.loads(encode_allocated(value))
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(AnnotationError, match=fragment):
        decode_allocated(json.dumps(doc))
