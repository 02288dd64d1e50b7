"""The node agent's usage report (``/usage.json``): round trip and refusals that name the field."""

from __future__ import annotations

import json

import pytest

from gpupool.api.fields import AnnotationError
from gpupool.api.usage_report import (
    CardUsageReport,
    ContainerUsageReport,
    NodeUsageReport,
    decode_usage_report,
    encode_usage_report,
)

REPORT = NodeUsageReport(
    "n1", "proc-scan", 600.0,
    (CardUsageReport(0, "GPU-0", "T4", "busy", 50, 3500, 16384, 1, 0.0),
     CardUsageReport(1, "GPU-1", "T4", "idle", None, None, 16384, 2, 720.5)),
    (ContainerUsageReport("ml", "job-0", "train", 0, 3000, 4096, 40, 30, 1),))


def test_round_trip() -> None:
    assert decode_usage_report(encode_usage_report(REPORT)) == REPORT


def doc_with(**changes: object) -> str:
    doc = json.loads(encode_usage_report(REPORT))
    for path, value in changes.items():
        target = doc
        *parents, key = path.split("__")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(key) if key.isdigit() else key] = value
    return json.dumps(doc)


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("[]", "expected a JSON object", id="not-an-object"),
    pytest.param(doc_with(v=2), "unsupported schema version 2", id="version"),
    pytest.param(doc_with(cards__0__state="asleep"), "cards[0].state: one of free, busy, idle", id="state"),
    pytest.param(doc_with(cards__1__holders="2"), "cards[1].holders: expected int", id="holders-type"),
    pytest.param(doc_with(cards__0__utilizationPercent=True), "utilizationPercent: expected int or NoneType, "
                 "got a boolean", id="boolean"),
    pytest.param(doc_with(containers__0="x"), "containers[0]: expected a JSON object", id="container-type"),
    pytest.param(doc_with(node=None), "usage report.node: expected str", id="node"),
])
def test_a_bad_report_names_the_field(text: str, message: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_usage_report(text)
    assert message in str(caught.value)


def test_a_containers_heartbeat_is_optional_both_ways() -> None:
    beating = NodeUsageReport("n1", "proc-scan", 600.0, (), (
        ContainerUsageReport("ml", "job-0", "train", 0, 3000, 4096, 40, 30, 1, 12.5, False),
        ContainerUsageReport("ml", "job-1", "train", 0, 3000, 4096, 40, 30, 1)))
    doc = json.loads(encode_usage_report(beating))
    assert doc["containers"][0]["heartbeatAgeSeconds"] == 12.5 and doc["containers"][0]["heartbeatStale"] is False
    assert "heartbeatAgeSeconds" not in doc["containers"][1]  # no library there: absent, not 0
    assert decode_usage_report(encode_usage_report(beating)) == beating
    doc["containers"][0]["heartbeatAgeSeconds"] = 31
    assert decode_usage_report(json.dumps(doc)).containers[0].heartbeat_age_seconds == 31.0
    doc["containers"][0]["heartbeatStale"] = "yes"
    with pytest.raises(AnnotationError, match="heartbeatStale: expected bool"):
        decode_usage_report(json.dumps(doc))


def test_infrastructure_holders_are_an_optional_card_field() -> None:
    card = CardUsageReport(0, "GPU-0", "T4", "free", 0, 300, 16384, 1, 0.0, infrastructure_holders=1)
    report = NodeUsageReport("n1", "proc-scan", 600.0, (card,), ())
    text = encode_usage_report(report)
    assert json.loads(text)["cards"][0]["infrastructureHolders"] == 1 and decode_usage_report(text) == report
    assert "infrastructureHolders" not in encode_usage_report(REPORT)  # absent when none, as from older agents
    assert decode_usage_report(encode_usage_report(REPORT)).cards[0].infrastructure_holders == 0


def test_a_containers_claims_are_optional_both_ways() -> None:
    """A DRA container's row names the claims its grant came from (issue 24); an assignment's has none,
    and an older agent's report, without the field, reads as none."""
    dra = ContainerUsageReport("ml", "infer", "main", 1, 2000, 4096, 25, 30, 1, claims=("infer-gpu", "extra"))
    report = NodeUsageReport("n1", "proc-scan", 600.0, (), (dra, *REPORT.containers))
    doc = json.loads(encode_usage_report(report))
    assert doc["containers"][0]["claims"] == ["infer-gpu", "extra"] and "claims" not in doc["containers"][1]
    assert decode_usage_report(encode_usage_report(report)) == report
    for bad in ("infer-gpu", [""], [3]):
        doc["containers"][0]["claims"] = bad
        with pytest.raises(AnnotationError, match=r"containers\[0\]\.claims"):
            decode_usage_report(json.dumps(doc))
