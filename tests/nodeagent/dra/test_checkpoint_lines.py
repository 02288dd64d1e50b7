"""The checkpoint's claims are encoded once each across saves (checkpoint.KeptLines): concurrent
prepares save the file once per batch with every claim, and re-encoding all of them each time was
1-2 ms per save of 100, taken from the event loop receiving the calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpupool.nodeagent.dra import checkpoint
from gpupool.nodeagent.dra.checkpoint import KeptLines, PreparedClaim
from gpupool.nodeagent.dra.claim_allocation import AllocatedShare, ClaimRef


def prepared(i: int, memory: int = 512) -> PreparedClaim:
    share = AllocatedShare(request="gpu", pool="node-a", device=f"gpu-{i % 2}",
                           card=i % 2, memory_mib=memory, compute_percent=1, share_id=f"s{i}")
    return PreparedClaim(ClaimRef("ns", f"c{i}", f"uid-{i}"), ("ns", f"p{i}"), f"pod-{i}", (share,),
                         f"gpupool.io/claim=uid-{i}")


def count_encodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    encoded: list[str] = []
    real = checkpoint._entry

    def counting(c: PreparedClaim) -> dict[str, Any]:
        encoded.append(c.claim.uid)
        return real(c)

    monkeypatch.setattr(checkpoint, "_entry", counting)
    return encoded


def test_a_save_encodes_only_the_claims_new_since_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    claims = {c.claim.uid: c for c in (prepared(i) for i in range(5))}
    kept = KeptLines()
    assert checkpoint.encode(claims, kept) == checkpoint.encode(claims)
    encoded = count_encodes(monkeypatch)
    claims["uid-9"] = prepared(9)
    del claims["uid-1"]
    text = checkpoint.encode(claims, kept)
    assert encoded == ["uid-9"]
    assert text == checkpoint.encode(claims, KeptLines())
    assert checkpoint.decode(text) == claims


def test_a_claim_prepared_again_under_its_uid_is_encoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = KeptLines()
    checkpoint.encode({"uid-1": prepared(1)}, kept)
    again = prepared(1, memory=2048)  # a new object: the claim was unprepared and prepared anew
    encoded = count_encodes(monkeypatch)
    text = checkpoint.encode({"uid-1": again}, kept)
    assert encoded == ["uid-1"]
    assert checkpoint.decode(text) == {"uid-1": again}
    assert json.loads(text)["claims"][0]["shares"][0]["memory_mib"] == 2048


def test_a_forgotten_claim_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = KeptLines()
    one = prepared(1)
    checkpoint.encode({"uid-1": one}, kept)
    checkpoint.encode({}, kept)
    encoded = count_encodes(monkeypatch)
    checkpoint.encode({"uid-1": one}, kept)
    assert encoded == ["uid-1"]  # not served from a line of a claim the file no longer held
