"""HAMi's card restriction annotations, parsed and matched as HAMi matches them."""

from __future__ import annotations

import pytest

from gpupool.kube.pod_options import CardRestrictions, hami_card_restrictions

A100 = ("NVIDIA-A100-SXM4-80GB", "GPU-a")
T4 = ("Tesla-T4", "GPU-t")


def test_the_four_annotations_are_parsed_as_comma_lists() -> None:
    found = hami_card_restrictions({"nvidia.com/use-gputype": "A100, H100", "nvidia.com/nouse-gputype": "T4",
                                    "nvidia.com/use-gpuuuid": "GPU-a,GPU-b", "nvidia.com/nouse-gpuuuid": ""})
    assert found == CardRestrictions(use_types=frozenset({"A100", "H100"}), avoid_types=frozenset({"T4"}),
                                     use_uuids=frozenset({"GPU-a", "GPU-b"}))


@pytest.mark.parametrize(("restrictions", "allowed"), [
    pytest.param(CardRestrictions(), {A100, T4}, id="none"),
    pytest.param(CardRestrictions(use_types=frozenset({"a100"})), {A100}, id="use-type-substring-any-case"),
    pytest.param(CardRestrictions(avoid_types=frozenset({"T4"})), {A100}, id="avoid-type"),
    pytest.param(CardRestrictions(use_uuids=frozenset({"GPU-t"})), {T4}, id="pin-uuid"),
    pytest.param(CardRestrictions(avoid_uuids=frozenset({"GPU-t"})), {A100}, id="avoid-uuid"),
    pytest.param(CardRestrictions(use_uuids=frozenset({"GPU-t"}), avoid_uuids=frozenset({"GPU-t"})), {T4},
                 id="a-pin-wins-over-avoid-as-in-hami"),
])
def test_which_cards_pass(restrictions: CardRestrictions, allowed: set[tuple[str, str]]) -> None:
    assert {card for card in (A100, T4) if restrictions.allows(*card)} == allowed
