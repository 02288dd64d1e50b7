"""The CEL subset the extender reads in DRA device selectors (issue 24, docs/dra.md "Selectors the
extender reads"): each construct evaluated as CEL defines it, everything else refused with a
reason (never an exception of another kind, never a guess), hostile input refused quickly."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from gpupool.core.model import GpuCard, GpuKind, Topology
from gpupool.kube.card_device import card_device
from gpupool.kube.device_selector import (
    MAX_DEPTH,
    Device,
    EvalError,
    Unsupported,
    device_schema,
    evaluate,
    parse,
    selection,
)
from gpupool.nodeagent.dra.resource_slice import device_entry
from gpupool.nodeagent.gpu_inventory import GpuInventory

DRIVER = "gpu.gpupool.io"
SCHEMA = device_schema(DRIVER)
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'
A100 = card_device(GpuCard(0, "GPU-a", "NVIDIA-A100-SXM4-80GB", 81920), DRIVER)
MIG = card_device(GpuCard(1, "MIG-b", "NVIDIA-A100-SXM4-80GB", 40192, compute=428, kind=GpuKind.VIRTUAL,
                          profile="3g.40gb", parent="GPU-a"), DRIVER)


def check(text: str, device: Device = A100) -> object:
    return evaluate(parse(text, SCHEMA), device)


@pytest.mark.parametrize(("text", "expected"), [
    (f'{A}.model.startsWith("NVIDIA-A100")', True),
    (f'{A}.model.endsWith("80GB")', True),
    (f'{A}.model.contains("H100")', False),
    (f'{A}["model"] == "NVIDIA-A100-SXM4-80GB"', True),
    (f'{A}.model != "NVIDIA-A100-SXM4-80GB"', False),
    (f'{A}.model < "NVIDIA-B"', True),
    (f'{A}.uuid >= "GPU-b"', False),
    (f"{A}.index == 0", True),
    (f"{A}.index > -1 && {A}.index <= 3", True),
    (f'{A}.kind == "physical"', True),
    ('device.driver == "gpu.gpupool.io"', True),
    ("true == !false", True),
    ("false < true", True),
    (f'{C}.memory.compareTo(quantity("40Gi")) >= 0', True),
    (f'{C}.memory.compareTo(quantity("80Gi")) == 0', True),
    (f'{C}.memory.isGreaterThan(quantity("80Gi"))', False),
    (f'{C}.memory.isLessThan(quantity("100G"))', True),
    (f'{C}.compute.compareTo(quantity("100")) == 0', True),
    (f'"profile" in {A}', False),
    (f'"memory" in {C}', True),
    (f'!("profile" in {A}) || {A}.profile == "3g.40gb"', True),
    (f'({A}.index == 1 || {A}.index == 0) && !({A}.model.contains("T4"))', True),
    ("'single' == \"single\" && \"a\\\"b\".contains('\"')", True),
])
def test_each_construct_evaluates_as_cel_defines_it(text: str, expected: object) -> None:
    assert check(text) == expected


def test_a_mig_device_carries_its_profile_parent_and_share_of_compute() -> None:
    assert check(f'{A}.kind == "virtual" && {A}.profile == "3g.40gb" && {A}.parent == "GPU-a"', MIG) is True
    assert check(f'{C}.compute.compareTo(quantity("42")) == 0', MIG) is True


def test_a_missing_attribute_is_a_runtime_error_unless_the_other_side_decides() -> None:
    with pytest.raises(EvalError, match="profile"):
        check(f'{A}.profile == "3g.40gb"')
    assert check(f'{A}.profile == "3g.40gb" || true') is True  # CEL's || absorbs the error
    assert check(f'{A}.profile == "3g.40gb" && false') is False
    assert check(f'"profile" in {A} && {A}.profile == "3g.40gb"') is False
    with pytest.raises(EvalError):
        check(f'{A}.profile == "3g.40gb" || false')


def test_the_extenders_view_of_a_card_is_what_the_node_agent_publishes() -> None:
    cards = (GpuCard(0, "GPU-a", "NVIDIA-A100-SXM4-80GB", 81920 + 100),
             GpuCard(1, "MIG-b", "NVIDIA-A100-SXM4-80GB", 40192, compute=428, kind=GpuKind.VIRTUAL,
                     profile="3g.40gb", parent="GPU-a"))
    inventory = GpuInventory(cards, Topology.flat(2), ("/dev/nvidia0", "/dev/nvidia0"))
    for card in cards:
        entry = device_entry(inventory, card.index)
        seen = card_device(card, DRIVER)
        published = {name: next(iter(value.values())) for name, value in entry["attributes"].items()
                     if "/" not in name}  # the PCI bus ID (resource.kubernetes.io) is not in the ledger
        assert dict(seen.attributes[DRIVER]) == published
        capacity = {name: Decimal(2**20) * int(c["value"].removesuffix("Mi")) if c["value"].endswith("Mi")
                    else Decimal(c["value"]) for name, c in entry["capacity"].items()}
        assert dict(seen.capacity[DRIVER]) == capacity


@pytest.mark.parametrize(("text", "why"), [
    (f'{A}.model.matches("^NVIDIA")', "matches"),
    (f"{A}.model == 1", "between string and int"),
    (f'{C}.memory == quantity("1Gi")', "compareTo"),
    (f'{C}.memory.compareTo(1) > 0', "compareTo"),
    (f'{A}.model.startsWith(1)', "startsWith"),
    (f"{A}.index", "not bool"),
    (f"{A}.index + 1 == 2", "character '+'"),
    (f"{A}.index == 1.5", "64-bit"),
    (f"{A}.index == 99999999999999999999", "64-bit"),
    (f'{A}.driverVersion == "1"', "'driverVersion'"),
    ('device.attributes["resource.kubernetes.io"].pciBusID == "0000:3b:00.0"', "resource.kubernetes.io"),
    (f'{C}.bandwidth.isGreaterThan(quantity("1"))', "'bandwidth'"),
    ('device.attributes["gpu.gpupool.io"].model == "a" ? true : false', "'?'"),
    (f'{A}.model.lowerAscii() == "a"', "lowerAscii"),
    (f"size({A}.model) > 3", "'size'"),
    ("1 < 2 < 3", "chained"),
    (f'{A}.model == "unclosed', "not closed"),
    (f'{A}.model == """x"""', "triple"),
    (f'{A}.model == "\\u0041"', "escape"),
    ('"x" in "xy"', "'in'"),
    ('quantity("lots").isLessThan(quantity("1"))', "quantity"),
    ("!1", "! of int"),
    ("true && 1", "needs bools"),
    ('semver("1.2.3").isLessThan(semver("1.3.0"))', "semver"),
    ("device.name == 'gpu-0'", "device.name"),
    ("", "unexpected"),
    ("true true", "unexpected"),
])
def test_anything_outside_the_subset_is_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(Unsupported, match=why.replace("(", r"\(").replace("?", r"\?").replace("+", r"\+")):
        parse(text, SCHEMA)


@pytest.mark.parametrize("text", [
    "(" * (MAX_DEPTH + 1) + "true" + ")" * (MAX_DEPTH + 1),
    "!" * 200 + "true",
    "(" * 100_000 + "true" + ")" * 100_000,
    f'{A}.model == "' + "x" * 5_000 + '"',
    f'{A}.model == "' + "x" * 10_000_000 + '"',
    " && ".join(["true"] * 5_000),
    "a" * 10_000_000,
])
def test_hostile_input_is_refused_quickly(text: str) -> None:
    started = time.perf_counter()
    with pytest.raises(Unsupported):
        parse(text, SCHEMA)
    assert time.perf_counter() - started < 0.05


def test_the_largest_accepted_expression_evaluates_quickly() -> None:
    text = " && ".join([f'{A}.model.startsWith("NVIDIA")'] * 18)  # 251 tokens
    tree = parse(text, SCHEMA)
    started = time.perf_counter()
    for _ in range(100):
        assert evaluate(tree, A100) is True
    assert time.perf_counter() - started < 0.5


def test_a_requests_selectors_read_as_one_selection_all_of_which_must_match() -> None:
    assert selection(None, SCHEMA) is None and selection([], SCHEMA) is None
    chosen = selection([{"cel": {"expression": f'{A}.model.startsWith("NVIDIA-A100")'}},
                        {"cel": {"expression": f'{A}.kind == "physical"'}}], SCHEMA)
    assert chosen is not None and chosen.matches(A100) and not chosen.matches(MIG)
    again = selection([{"cel": {"expression": f'{A}.model.startsWith("NVIDIA-A100")'}},
                       {"cel": {"expression": f'{A}.kind == "physical"'}}], SCHEMA)
    assert again == chosen and hash(again) == hash(chosen)  # the extender keeps results per selection
    odds: list[object] = ["x", [{"cel": {}}], [{"cel": {"expression": "true"}, "other": 1}], [{}] * 33]
    for odd in odds:
        with pytest.raises(Unsupported):
            selection(odd, SCHEMA)


def test_literals_of_different_types_are_different_trees() -> None:
    assert parse("1 == 1", SCHEMA) != parse("true == true", SCHEMA)


# ----------------------------------------------------------------------------- 'in' a list (issue 24)

@pytest.mark.parametrize(("text", "expected"), [
    (f'{A}.uuid in ["GPU-x", "GPU-a"]', True),
    (f'{A}.uuid in ["GPU-x"]', False),
    (f"{A}.uuid in []", False),
    (f'!({A}.uuid in ["GPU-a"])', False),
    (f"{A}.index in [3, -1, 0]", True),
    (f'{A}.model.startsWith("NVIDIA") && {A}.uuid in ["GPU-a",]', True),
])
def test_in_a_list_of_literals(text: str, expected: bool) -> None:
    assert check(text) is expected


@pytest.mark.parametrize("text", [
    f'{A}.uuid in [1]',
    f'{A}.index in ["0"]',
    f'{A}.uuid in [{A}.model]',
    f'{C}.memory in [1]',
    f'{A}.uuid in ["a" "b"]',
])
def test_in_a_list_of_another_type_or_not_literals_is_refused(text: str) -> None:
    with pytest.raises(Unsupported):
        parse(text, SCHEMA)


def test_the_resource_groups_selectors_on_claims_are_read_and_select_their_cards() -> None:
    """What the claim-groups webhook writes stays readable by the extender's card choice for claim
    pods, up to the largest list one expression holds."""
    from gpupool.kube.claim_groups import ClaimCards, selector_expressions

    many = frozenset(f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}" for i in range(220))
    for cards, a100 in ((ClaimCards(many | {"GPU-a"}, frozenset(), "g"), True),
                        (ClaimCards(None, many | {"GPU-a"}, "g"), False),
                        (ClaimCards(frozenset({"GPU-z"}), frozenset(), "g"), False)):
        found = selection([{"cel": {"expression": e}} for e in selector_expressions(cards, DRIVER)], SCHEMA)
        assert found is not None and found.matches(A100) is a100
        assert found.attribute_names() == {"uuid"}
