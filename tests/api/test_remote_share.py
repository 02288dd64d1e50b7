"""The remote share's two annotations: the pod's request and the bind's record (gpupool/api/remote_share.py)."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from gpupool.api.annotations import AnnotationError, Assignment, CardRef, ContainerCards
from gpupool.api.names import ResourceNames
from gpupool.api.remote_share import RemoteShare, decode_remote_share, encode_remote_share, wants_remote

NAMES = ResourceNames()
WHEN = dt.datetime(2026, 11, 28, 17, 0, tzinfo=dt.UTC)
SHARE = RemoteShare(server="gpu-7", time=WHEN, container="main", pod_uid="uid-1",
                    card=CardRef(index=1, uuid="GPU-7-1", memory_mib=8192, compute=300))


@pytest.mark.parametrize(("annotations", "wanted"), [
    ({}, False), ({"gpupool.io/remote-gpu": "false"}, False), ({"gpupool.io/remote-gpu": "true"}, True)])
def test_the_request_annotation_reads_true_or_false(annotations: dict[str, str], wanted: bool) -> None:
    assert wants_remote(annotations, NAMES) is wanted


@pytest.mark.parametrize("value", ["yes", "True", "", 1])
def test_any_other_request_value_is_refused_with_the_annotation_named(value: object) -> None:
    with pytest.raises(AnnotationError, match=re.escape('gpupool.io/remote-gpu must be "true" or "false"')):
        wants_remote({"gpupool.io/remote-gpu": value}, NAMES)


def test_the_share_survives_its_round_trip_and_reads_as_an_assignment_of_the_server() -> None:
    assert decode_remote_share(encode_remote_share(SHARE)) == SHARE
    assert SHARE.as_assignment() == Assignment(node="gpu-7", time=WHEN, pod_uid="uid-1",
                                               containers=(ContainerCards("main", (SHARE.card,)),))
    assert RemoteShare.from_assignment(SHARE.as_assignment()) == SHARE


def test_an_assignment_of_two_containers_or_no_card_is_no_remote_share() -> None:
    two = Assignment(node="g", time=WHEN, containers=(ContainerCards("main", (SHARE.card,)),
                                                      ContainerCards("side", (SHARE.card,))))
    none = Assignment(node="g", time=WHEN, containers=(ContainerCards("main", ()),))
    for assignment in (two, none):
        with pytest.raises(ValueError, match="one container's cards"):
            RemoteShare.from_assignment(assignment)


SECOND = CardRef(index=3, uuid="GPU-7-3", memory_mib=8192, compute=300)
TWO = RemoteShare(server="gpu-7", time=WHEN, container="main", pod_uid="uid-1", card=SHARE.card,
                  more_cards=(SECOND,))


def test_a_one_card_share_written_before_several_cards_decodes_the_same() -> None:
    """The exact text the one-card bind wrote (and still writes): no "cards", the same share."""
    written = ('{"v":1,"server":"gpu-7","time":"2026-11-28T17:00:00.000000Z","podUID":"uid-1","container":"main",'
               '"card":{"index":1,"uuid":"GPU-7-1","memoryMiB":8192,"computeMilli":300,"exclusive":false}}')
    assert decode_remote_share(written) == SHARE
    assert SHARE.cards == (SHARE.card,) and SHARE.more_cards == ()
    assert encode_remote_share(SHARE) == written


def test_a_share_of_two_cards_lists_them_in_device_order_and_books_both_on_the_server() -> None:
    value = encode_remote_share(TWO)
    doc = json.loads(value)
    assert "card" not in doc and [c["uuid"] for c in doc["cards"]] == ["GPU-7-1", "GPU-7-3"]
    assert decode_remote_share(value) == TWO and TWO.cards == (SHARE.card, SECOND)
    assert TWO.as_assignment().containers == (ContainerCards("main", (SHARE.card, SECOND)),)
    assert RemoteShare.from_assignment(TWO.as_assignment()) == TWO


def two_doc(**changes: object) -> str:
    base: dict[str, object] = json.loads(encode_remote_share(TWO))
    base.update(changes)
    return json.dumps(base)


@pytest.mark.parametrize(("value", "words"), [
    (two_doc(card=json.loads(encode_remote_share(SHARE))["card"]), "both card and cards"),
    (two_doc(cards=[json.loads(encode_remote_share(SHARE))["card"]]), "2 to 16 cards"),
    (two_doc(cards=[json.loads(encode_remote_share(SHARE))["card"]] * 2), "each card once"),
    (two_doc(cards=[1, 2]), r"cards\[0\] must be an object"),
    (two_doc(cards="GPU-7-1"), "cards: expected"),
])
def test_a_malformed_list_of_cards_is_refused_naming_the_field(value: str, words: str) -> None:
    with pytest.raises(AnnotationError, match=words):
        decode_remote_share(value)


def doc(**changes: object) -> str:
    base: dict[str, object] = json.loads(encode_remote_share(SHARE))
    for key, value in changes.items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return json.dumps(base)


@pytest.mark.parametrize(("value", "words"), [
    (doc(server=None), "missing field 'server'"),
    (doc(v=2), "unsupported schema version"),
    (doc(card={"index": 0, "uuid": "u", "memoryMiB": 1, "computeMilli": 1}), "missing field 'exclusive'"),
    (doc(card={"index": 0, "uuid": "u", "memoryMiB": 0, "computeMilli": 0, "exclusive": False}),
     "holds memory, compute or both"),
    (doc(card={"index": 0, "uuid": "u", "memoryMiB": 1, "computeMilli": 1001, "exclusive": False}),
     "computeMilli"),
    (doc(time="yesterday"), "remote-share-v1.time"),
    ("not json", "not valid JSON"),
])
def test_a_broken_share_is_refused_with_the_field_named(value: str, words: str) -> None:
    with pytest.raises(AnnotationError, match=words):
        decode_remote_share(value)
