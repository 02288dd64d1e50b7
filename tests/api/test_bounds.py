"""Every number and name of the three documents is bounded (gpupool.api.limits), on read and on write."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import pytest

from gpupool.api import limits
from gpupool.api.annotations import (
    Allocated,
    AllocatedContainer,
    AnnotationError,
    Assignment,
    CardRef,
    ContainerCards,
    Inventory,
    check_inventory,
    decode_allocated,
    decode_assignment,
    decode_inventory,
    encode_allocated,
    encode_assignment,
    encode_inventory,
)
from gpupool.api.limits import (
    MAX_CARD_INDEX,
    MAX_CARD_MEMORY_MIB,
    MAX_CARDS_PER_NODE,
    MAX_DEVICES_PER_RESOURCE,
    MAX_TEXT_CHARS,
)
from gpupool.core import model as core_model
from gpupool.core.model import GpuCard, LinkLevel, Topology

WHEN = dt.datetime(2024, 5, 1, 10, 0, tzinfo=dt.UTC)
Mutation = Callable[[dict[str, Any]], object]


def inventory_doc(count: int = 2) -> dict[str, Any]:
    cards = [{"index": i, "uuid": f"GPU-{i}", "model": "T4", "memoryMiB": 15360, "healthy": True}
             for i in range(count)]
    return {"v": 1, "cards": cards}


def card(doc: dict[str, Any], **values: Any) -> None:
    doc["cards"][0].update(values)


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        pytest.param(lambda d: card(d, memoryMiB=10**30), r"cards\[0\]\.memoryMiB: at most 1048576 MiB",
                     id="31-digit-memory"),
        pytest.param(lambda d: card(d, memoryMiB=MAX_CARD_MEMORY_MIB + 1), "memoryMiB: at most", id="memory-past-1TiB"),
        pytest.param(lambda d: card(d, memoryMiB=1.5), "memoryMiB: expected int, got float", id="fractional-memory"),
        pytest.param(lambda d: card(d, index=MAX_CARD_INDEX + 1), f"index: at most {MAX_CARD_INDEX}",
                     id="index-too-large"),
        pytest.param(lambda d: card(d, index=-1), "index: must be non-negative", id="negative-index"),
        pytest.param(lambda d: card(d, model="T4\n2024-01-01 ERROR forged"), "model: must not contain control",
                     id="model-with-newline"),
        pytest.param(lambda d: card(d, uuid="GPU-\x1b[31m"), "uuid: must not contain control", id="uuid-with-escape"),
        pytest.param(lambda d: card(d, model="M" * (MAX_TEXT_CHARS + 1)), "model: at most 512 characters",
                     id="model-too-long"),
        pytest.param(lambda d: card(d, uuid=""), "uuid: must be non-empty", id="empty-uuid"),
        pytest.param(lambda d: d.update(inventory_doc(MAX_CARDS_PER_NODE + 1)), "cards: at most 64 cards",
                     id="too-many-cards"),
        pytest.param(lambda d: card(d, kind="x" * 10_000), "physical or virtual, got 'xxxx", id="huge-kind"),
    ],
)
def test_inventory_values_past_the_bounds_are_refused(mutate: Mutation, fragment: str) -> None:
    doc = inventory_doc()
    mutate(doc)
    with pytest.raises(AnnotationError, match=fragment):
        decode_inventory(json.dumps(doc))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("[" * 100_000, "not valid JSON", id="deep-nesting"),
        pytest.param('{"v": 1, "cards": [{"memoryMiB": ' + "9" * 5000 + "}]}", "not valid JSON", id="5000-digits"),
        pytest.param('{"v": 1, "cards": [{"index": 0, "uuid": "a", "model": "T4", "memoryMiB": NaN, '
                     '"healthy": true}]}', "expected int, got float", id="nan-memory"),
    ],
)
def test_inventory_text_that_breaks_the_parser_is_an_annotation_error(text: str, fragment: str) -> None:
    with pytest.raises(AnnotationError, match=fragment):
        decode_inventory(text)


def test_values_at_the_bounds_are_accepted() -> None:
    cards = tuple(GpuCard(index=MAX_CARD_INDEX - i, uuid=f"GPU-{i}", model="M" * MAX_TEXT_CHARS,
                          memory_mib=MAX_CARD_MEMORY_MIB) for i in range(MAX_CARDS_PER_NODE))
    inventory = Inventory(tuple(sorted(cards, key=lambda c: c.index)))
    assert decode_inventory(encode_inventory(inventory)) == inventory


@pytest.mark.parametrize(
    ("inventory", "fragment"),
    [
        pytest.param(Inventory((GpuCard(0, "GPU-a", "T4", 2 * MAX_CARD_MEMORY_MIB),)), "cards[0].memoryMiB: at most",
                     id="memory-the-core-holds-but-the-contract-refuses"),
        pytest.param(Inventory((GpuCard(0, "GPU-a", "T4", 1), GpuCard(1, "GPU-a", "T4", 1))),
                     "cards[1].uuid: GPU-a appears twice", id="duplicate-uuid"),
        pytest.param(Inventory((GpuCard(0, "GPU-a", "T4", 1),), Topology.flat(2)),
                     "links: expected a 1x1 matrix", id="links-of-wrong-size"),
        pytest.param(Inventory((GpuCard(0, "GPU-a", "T4\x00", 1),)), "model: must not contain control",
                     id="model-with-nul"),
    ],
)
def test_the_writer_refuses_what_the_reader_would(inventory: Inventory, fragment: str) -> None:
    """One rule on both sides: the node side cannot publish an inventory the extender refuses."""
    with pytest.raises(AnnotationError) as refused:
        encode_inventory(inventory)
    assert fragment in str(refused.value)
    with pytest.raises(AnnotationError) as checked:
        check_inventory(inventory, what="gpus.yaml")
    assert str(checked.value).startswith("gpus.yaml.cards") or str(checked.value).startswith("gpus.yaml.links")


def test_a_good_inventory_passes_the_check() -> None:
    check_inventory(Inventory((GpuCard(0, "GPU-a", "NVIDIA A100-SXM4-80GB", 81920),),
                              Topology(((LinkLevel.SELF,),))))


def assignment_doc() -> dict[str, Any]:
    value = Assignment("n1", WHEN, (ContainerCards("main", (CardRef(0, "GPU-0", 4096, 300),)),))
    doc: dict[str, Any] = json.loads(encode_assignment(value))
    return doc


def first_card(doc: dict[str, Any], **values: Any) -> None:
    doc["containers"][0]["cards"][0].update(values)


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        pytest.param(lambda d: first_card(d, memoryMiB=10**30), "memoryMiB: at most 1048576 MiB", id="huge-memory"),
        pytest.param(lambda d: first_card(d, index=10**6), f"index: at most {MAX_CARD_INDEX}", id="huge-index"),
        pytest.param(lambda d: first_card(d, computeMilli=-5), "computeMilli: must be non-negative",
                     id="negative-compute"),
        pytest.param(lambda d: d.update(node="n1\r\nforged"), "node: must not contain control", id="node-with-crlf"),
        pytest.param(lambda d: d["containers"][0].update(name=""), "name: must be non-empty", id="empty-container"),
        pytest.param(lambda d: d["containers"][0].update(cards=[dict(d["containers"][0]["cards"][0], index=i)
                                                                for i in range(MAX_CARDS_PER_NODE + 1)]),
                     "cards: at most 64 cards", id="too-many-cards"),
    ],
)
def test_assignment_values_past_the_bounds_are_refused(mutate: Mutation, fragment: str) -> None:
    doc = assignment_doc()
    mutate(doc)
    with pytest.raises(AnnotationError, match=fragment):
        decode_assignment(json.dumps(doc))


def allocated_doc() -> dict[str, Any]:
    value = Allocated("n1", WHEN, (AllocatedContainer("main", (CardRef(0, "GPU-0", 4096, 300),),
                                                      resources={"gpupool.io/gpu-mem": 16}),))
    doc: dict[str, Any] = json.loads(encode_allocated(value))
    return doc


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        pytest.param(lambda d: d["containers"][0]["cards"][0].update(computeMilli=1001), "computeMilli: at most 1000",
                     id="compute-past-a-card"),
        pytest.param(lambda d: d["containers"][0]["resources"].update({"gpupool.io/gpu-mem": 10**20}),
                     rf"resources\.gpupool\.io/gpu-mem: at most {MAX_DEVICES_PER_RESOURCE}", id="huge-device-count"),
        pytest.param(lambda d: d["containers"][0]["resources"].update({"bad\nname": 1}),
                     "resources: must not contain control", id="resource-name-with-newline"),
        pytest.param(lambda d: d.update(node=""), "node: must be non-empty", id="empty-node"),
    ],
)
def test_allocated_values_past_the_bounds_are_refused(mutate: Mutation, fragment: str) -> None:
    doc = allocated_doc()
    mutate(doc)
    with pytest.raises(AnnotationError, match=fragment):
        decode_allocated(json.dumps(doc))


@pytest.mark.parametrize(("contract", "core"), [
    pytest.param(limits.MAX_CARDS_PER_NODE, core_model.MAX_CARDS_PER_NODE, id="cards-per-node"),
    pytest.param(limits.MAX_CARD_INDEX, core_model.MAX_CARDS_PER_NODE - 1, id="card-index"),
    pytest.param(limits.MAX_CARD_MEMORY_MIB, core_model.MAX_CARD_MEMORY_MIB, id="card-memory"),
    pytest.param(limits.MAX_NODE_CPU_MILLI, core_model.MAX_NODE_CPU_MILLI, id="node-cpu"),
    pytest.param(limits.MAX_NODE_MEMORY_MIB, core_model.MAX_NODE_MEMORY_MIB, id="node-memory"),
])
def test_the_contract_accepts_nothing_the_core_model_refuses(contract: int, core: int) -> None:
    assert contract <= core
