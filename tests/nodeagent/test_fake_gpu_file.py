"""The fake-GPU file: every file whose inventory the extender would refuse stops the agent at load,
with the file and the field named; good files load as before."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.api.annotations import Inventory, decode_inventory, encode_inventory
from gpupool.cli.main import cli
from gpupool.core.model import GpuKind, LinkLevel
from gpupool.nodeagent.nvml.fake import FakeGpuBackend, FakeGpuFileError

GOOD = """\
model: NVIDIA-H200
cards:
  - {uuid: GPU-aaaa, memoryMiB: 143771}
  - {uuid: GPU-bbbb, memoryMiB: 143771, healthy: false, pciBusId: "00000000:3B:00.0"}
topology: [[0, 1]]
events:
  - {at: 30, card: 1, xid: 79}
  - {at: 60, card: 1, recover: true}
"""


def two_cards(first: str, second: str = "{uuid: GPU-b, memoryMiB: 16384}", extra: str = "") -> str:
    return f"model: T4\ncards:\n  - {first}\n  - {second}\n{extra}"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        # the six kinds the agent accepted and the extender then refused (or silently misread)
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1000000000000000000000000000000}"),
                     "cards[0].memoryMiB: at most 1048576 MiB", id="31-digit-memory"),
        pytest.param(two_cards("{index: -1, uuid: GPU-a, memoryMiB: 16384}"),
                     "cards[0].index: must be non-negative", id="negative-index"),
        pytest.param(two_cards("{uuid: GPU-b, memoryMiB: 16384}"), "cards[1].uuid: GPU-b appears twice",
                     id="duplicate-uuid"),
        pytest.param(two_cards("{index: 1, uuid: GPU-a, memoryMiB: 16384}", "{index: 1, uuid: GPU-b, memoryMiB: 1}"),
                     "cards[1].index: card index 1 appears twice", id="duplicate-index"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1.5}"), "cards[0].memoryMiB: expected a whole number, got 1.5",
                     id="fractional-memory"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: '16384'}"), "cards[0].memoryMiB: expected a whole number",
                     id="memory-as-text"),
        pytest.param(two_cards("{uuid: GPU-a, model: \"T4\\e[2J\", memoryMiB: 16384}"),
                     "cards[0].model: must not contain control", id="model-with-escape"),
        pytest.param(two_cards("{uuid: '', memoryMiB: 16384}"), "cards[0].uuid: must be non-empty", id="empty-uuid"),
        pytest.param("cards:\n" + "  - {memoryMiB: 1}\n" * 65,
                     "cards: at most 64 cards, got 65", id="too-many-cards"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1}", extra="links: [[0, 1, 1], [1, 0, 1], [1, 1, 0]]\n"),
                     "links: expected a 2x2 matrix", id="links-of-wrong-size"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1}", extra="links: [[0, 1], [2, 0]]\n"),
                     "links: not symmetric", id="links-not-symmetric"),
        # shapes the old loader turned into crashes or silent defaults
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1}", extra="links: [[0, 9], [9, 0]]\n"),
                     "links[0][1]: expected a link level 0..6, got 9", id="link-level-out-of-range"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1}", extra="topology: [[0, 5]]\n"),
                     "topology[0][1]: expected a card position 0..1", id="topology-names-no-card"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1, healthy: 'false'}"),
                     "cards[0].healthy: expected true or false, got 'false'", id="healthy-as-text"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMib: 1}"), "cards[0]: unknown field 'memoryMib'",
                     id="typo-in-a-card"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1}", extra="link: [[0, 1], [1, 0]]\n"),
                     "the file: unknown field 'link'", id="typo-at-the-top"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1}", extra="events: [{at: 1, card: 7, lost: true}]\n"),
                     "events[0].card: no card has index 7", id="event-for-no-card"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1}", extra="events: [{at: .nan, card: 0, lost: true}]\n"),
                     "events[0].at: expected seconds after start", id="event-at-nan"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1, pciBusId: '3B:00.0'}"),
                     "cards[0].pciBusId: '3B:00.0' is not a PCI address", id="pci-bus-id-without-domain"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1, pciBusId: 3}"),
                     "cards[0].pciBusId: expected a string", id="pci-bus-id-not-text"),
        pytest.param(two_cards("{uuid: MIG-a, memoryMiB: 1, kind: mig}"),
                     "cards[0].kind: expected physical or virtual, got 'mig'", id="unknown-kind"),
        pytest.param(two_cards("{uuid: MIG-a, memoryMiB: 1, kind: virtual, computeMilli: 1200}"),
                     "cards[0].computeMilli: at most 1000", id="compute-past-a-card"),
        pytest.param(two_cards("{uuid: GPU-a, memoryMiB: 1, profile: 3g.40gb}"),
                     "cards[0]: profile and parent belong to a virtual card only", id="profile-on-a-physical-card"),
        pytest.param("cards: {uuid: GPU-a}\n", "cards: expected a list of cards", id="cards-not-a-list"),
        pytest.param("cards: [{memoryMiB: " + "9" * 5000 + "}]\n", "not a YAML document", id="5000-digits"),
    ],
)
def test_a_bad_file_is_refused_at_load_naming_file_and_field(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(text)
    with pytest.raises(FakeGpuFileError) as refused:
        FakeGpuBackend.from_file(path)
    assert str(refused.value).startswith(f"{path}: ")
    assert fragment in str(refused.value)


def test_the_documented_file_loads_and_publishes_what_the_extender_reads(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(GOOD)
    inventory = FakeGpuBackend.from_file(path).inventory()
    assert [(c.index, c.uuid, c.model, c.memory_mib, c.healthy) for c in inventory.cards] == [
        (0, "GPU-aaaa", "NVIDIA-H200", 143771, True), (1, "GPU-bbbb", "NVIDIA-H200", 143771, False)]
    assert inventory.topology.link(0, 1) == LinkLevel.PCIE_SWITCH
    assert [inventory.pci_bus_id(0), inventory.pci_bus_id(1)] == ["", "00000000:3B:00.0"]
    published = Inventory(inventory.cards, inventory.topology)
    assert decode_inventory(encode_inventory(published)) == published


def test_the_agent_does_not_start_on_a_bad_file(tmp_path: Path) -> None:
    """The command stops before it talks to kubelet or the API: nothing is served or published."""
    path = tmp_path / "gpus.yaml"
    path.write_text(two_cards("{uuid: GPU-a, memoryMiB: 1000000000000000000000000000000}"))
    result = CliRunner().invoke(cli, ["node-agent", "--node-name", "n1", "--fake-gpus", str(path),
                                      "--plugin-dir", str(tmp_path / "plugins"),
                                      "--kubeconfig", str(tmp_path / "no-such-kubeconfig")])
    assert result.exit_code == 2, result.output
    assert "--fake-gpus" in result.output and "cards[0].memoryMiB: at most 1048576 MiB" in result.output


def test_the_usage_script_is_what_the_fake_backend_samples() -> None:
    """The monitor samples the backend; the fake one replays the file's ``usage`` key by card index."""
    clock = [100.0]
    backend = FakeGpuBackend.from_dict({"cards": [{"index": 2, "memoryMiB": 1000}, {"index": 5, "memoryMiB": 2000}],
                                        "usage": [{"at": 0, "card": 1, "utilization": 70,
                                                   "processes": [{"pid": 9, "memoryMiB": 500, "sm": 70}]},
                                                  {"at": "1m", "card": 1, "utilization": 0}]},
                                       clock=lambda: clock[0])
    first = backend.sample_usage()
    assert [(c.index, c.utilization_percent, c.memory_used_mib, c.memory_total_mib) for c in first.cards] == [
        (2, 0, 0, 1000), (5, 70, 500, 2000)]
    clock[0] = 160.0
    assert backend.sample_usage().card(5).utilization_percent == 0  # type: ignore[union-attr]


def test_without_a_usage_script_every_card_is_unused() -> None:
    backend = FakeGpuBackend.from_dict({"cards": [{"memoryMiB": 1000}]})
    assert [(c.index, c.utilization_percent, c.memory_total_mib) for c in backend.sample_usage().cards] == [
        (0, 0, 1000)]


def test_a_bad_usage_script_stops_the_load_with_the_entry_named() -> None:
    with pytest.raises(FakeGpuFileError, match=r"<dict>: usage\[0\]: 120 is not a percentage"):
        FakeGpuBackend.from_dict({"cards": [{"memoryMiB": 1000}], "usage": [{"at": 0, "card": 0, "utilization": 120}]})


def test_a_file_may_describe_mig_instances_as_virtual_cards() -> None:
    """What the NVML backend publishes for a card in MIG mode, written by hand for a node without one."""
    backend = FakeGpuBackend.from_dict({"model": "NVIDIA-A100", "cards": [
        {"uuid": "MIG-a", "memoryMiB": 19968, "kind": "virtual", "computeMilli": 428, "profile": "3g.20gb",
         "parent": "GPU-p"},
        {"uuid": "GPU-q", "memoryMiB": 40960}]})
    virtual, physical = backend.inventory().cards
    assert (virtual.kind, virtual.compute, virtual.profile, virtual.parent) == \
        (GpuKind.VIRTUAL, 428, "3g.20gb", "GPU-p")
    assert (physical.kind, physical.compute, physical.profile, physical.parent) == (GpuKind.PHYSICAL, 1000, "", "")
