"""``inventory-v1`` entries of virtual cards (MIG instances): kind, compute, profile and parent make
the round trip, physical cards are written as before, and entries that cannot be right are refused."""

from __future__ import annotations

import json

import pytest

from gpupool.api.annotations import AnnotationError, Inventory, decode_inventory, encode_inventory
from gpupool.core.model import GpuCard, GpuKind

MIG = GpuCard(0, "MIG-4f2a", "NVIDIA-H200", 71424, compute=428, kind=GpuKind.VIRTUAL, profile="3g.71gb",
              parent="GPU-parent")
WHOLE = GpuCard(1, "GPU-whole", "NVIDIA-H200", 143771)


def test_a_virtual_card_keeps_its_compute_profile_and_parent() -> None:
    value = encode_inventory(Inventory((MIG, WHOLE)))
    assert decode_inventory(value).cards == (MIG, WHOLE)
    entries = json.loads(value)["cards"]
    assert entries[0] == {"index": 0, "uuid": "MIG-4f2a", "model": "NVIDIA-H200", "memoryMiB": 71424,
                          "healthy": True, "kind": "virtual", "computeMilli": 428, "profile": "3g.71gb",
                          "parent": "GPU-parent"}
    assert entries[1] == {"index": 1, "uuid": "GPU-whole", "model": "NVIDIA-H200", "memoryMiB": 143771,
                          "healthy": True}  # what older readers read


def card_doc(**extra: object) -> str:
    entry = {"index": 0, "uuid": "MIG-x", "model": "A100", "memoryMiB": 4864, "healthy": True, **extra}
    return json.dumps({"v": 1, "cards": [entry]})


@pytest.mark.parametrize(("extra", "message"), [
    pytest.param({"kind": "virtual", "computeMilli": 1001}, r"cards\[0\].computeMilli: at most 1000", id="compute"),
    pytest.param({"kind": "virtual", "profile": ""}, r"cards\[0\].profile: must be non-empty", id="empty-profile"),
    pytest.param({"kind": "virtual", "parent": "GPU-\n"}, r"cards\[0\].parent: must not contain", id="parent-text"),
    pytest.param({"profile": "1g.5gb"}, "virtual card only", id="profile-on-physical"),
    pytest.param({"kind": "physical", "parent": "GPU-p"}, "virtual card only", id="parent-on-physical"),
])
def test_impossible_virtual_entries_are_refused(extra: dict[str, object], message: str) -> None:
    with pytest.raises(AnnotationError, match=message):
        decode_inventory(card_doc(**extra))
