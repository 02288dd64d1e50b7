"""``assignment-v1``'s ``podUID``: the pod the cards were decided for, optional for older documents.

Why the field exists: apiservers v1.20-v1.22 apply a Binding to whichever pod has its name, so a
pod replaced under that name between the extender's read and its Binding receives its
predecessor's assignment. With the uid in the document every reader can tell.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from gpupool.api.annotations import (
    AnnotationError,
    Assignment,
    CardRef,
    ContainerCards,
    decode_assignment,
    encode_assignment,
    foreign_assignment,
)
from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, NodeSpec, Placement

WHEN = dt.datetime(2024, 5, 1, 10, 0, tzinfo=dt.UTC)
CARDS = (ContainerCards("main", (CardRef(0, "GPU-0", 4000, 0),)),)
OLD_FORM = ('{"v":1,"node":"n1","time":"2024-05-01T10:00:00.000000Z","containers":[{"name":"main",'
            '"init":false,"cards":[{"index":0,"uuid":"GPU-0","memoryMiB":4000,"computeMilli":0,'
            '"exclusive":false}]}]}')
"""An assignment as extenders before ``podUID`` wrote it."""


def test_the_pod_uid_survives_a_round_trip() -> None:
    assignment = Assignment("n1", WHEN, CARDS, pod_uid="uid-1")
    text = encode_assignment(assignment)
    assert json.loads(text)["podUID"] == "uid-1"
    assert decode_assignment(text) == assignment


def test_from_placement_records_the_pod_uid() -> None:
    spec = NodeSpec("n1", 1000, 1000, cards=(GpuCard(0, "GPU-0", "T4", 16000),))
    placement = Placement("ns/p", "n1", 0, 0, (ContainerAssignment("main", (CardSlice(0, 4000, 0),)),))
    assert Assignment.from_placement(placement, spec, WHEN, pod_uid="uid-1").pod_uid == "uid-1"


def test_an_old_document_without_pod_uid_still_reads_and_is_written_unchanged() -> None:
    decoded = decode_assignment(OLD_FORM)
    assert decoded == Assignment("n1", WHEN, CARDS)
    assert decoded.pod_uid == ""
    assert encode_assignment(decoded) == OLD_FORM  # no podUID key when there is none


@pytest.mark.parametrize(("value", "fragment"), [
    pytest.param(7, "assignment-v1.podUID: expected str, got int", id="a-number"),
    pytest.param("", "assignment-v1.podUID", id="empty"),
    pytest.param("uid\n2", "assignment-v1.podUID", id="a-control-character"),
    pytest.param("u" * 600, "assignment-v1.podUID", id="too-long"),
])
def test_a_bad_pod_uid_is_refused_with_the_field_named(value: object, fragment: str) -> None:
    doc = json.loads(OLD_FORM) | {"podUID": value}
    with pytest.raises(AnnotationError, match=fragment):
        decode_assignment(json.dumps(doc))


@pytest.mark.parametrize(("decided_for", "uid", "foreign"), [
    pytest.param("uid-1", "uid-1", False, id="the-same-pod"),
    pytest.param("", "uid-1", False, id="written-before-podUID"),
    pytest.param("uid-1", "uid-2", True, id="a-pod-replaced-under-the-name"),
])
def test_foreign_assignment_names_both_uids(decided_for: str, uid: str, foreign: bool) -> None:
    problem = foreign_assignment(decided_for, uid)
    if not foreign:
        assert problem is None
        return
    assert problem is not None
    assert f"decided for pod uid {decided_for}, not this pod (uid {uid})" in problem
