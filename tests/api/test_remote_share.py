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


def test_an_assignment_of_several_cards_is_no_remote_share() -> None:
    two = Assignment(node="g", time=WHEN, containers=(ContainerCards("main", (SHARE.card, SHARE.card)),))
    with pytest.raises(ValueError, match="one card of one container"):
        RemoteShare.from_assignment(two)


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
