"""The prepared claims of this node, kept in one JSON file so an agent restart remembers them.

kubelet calls NodePrepareResources once per claim and NodeUnprepareResources when the last pod
using it is gone; an agent restarted in between must still answer a repeated prepare with the same
devices, and an unprepare by removing that claim's CDI spec. The file is written under a temporary
name and renamed (never half written). A file that cannot be read is an error that names it and
says what to do; the agent does not guess.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.files.replace import replace_file
from gpupool.nodeagent.dra.claim_allocation import AllocatedShare, ClaimRef

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """The checkpoint file exists but cannot be used; the message names the file and the fix."""


@dataclass(frozen=True)
class PreparedClaim:
    """A claim prepared on this node: its shares and the CDI device that carries its grant."""

    claim: ClaimRef
    pod: tuple[str, str]
    pod_uid: str
    shares: tuple[AllocatedShare, ...]
    cdi_id: str


def encode(claims: Mapping[str, PreparedClaim], kept: KeptLines | None = None) -> str:
    """The file's text for ``claims`` (UID → claim): one line per claim, built field by field and
    written by the C encoder (``asdict`` and ``indent`` made a save of 100 claims cost 40 ms). With
    ``kept``, a claim encoded by an earlier save is not encoded again (the text is the same)."""
    lines = (kept or KeptLines()).lines(claims)
    return f'{{"version":{FORMAT_VERSION},"claims":[\n' + ",\n".join(lines) + "\n]}\n"


class KeptLines:
    """Each claim's line of the file, kept from one save to the next by the one writer of the file.

    Concurrent prepares save the file once per batch, each time with every claim prepared: 100 at
    once made 10-20 batches, and re-encoding all the claims took 1-2 ms of each (the interpreter's
    time, which the event loop receiving the calls waits for). A claim's line depends only on the
    claim, so it is encoded once and reused while the same claim object is held under its UID
    (a claim prepared again is a new object and is encoded again). Not thread-safe: one writer.
    """

    def __init__(self) -> None:
        self._lines: dict[str, tuple[PreparedClaim, str]] = {}

    def lines(self, claims: Mapping[str, PreparedClaim]) -> list[str]:
        """The lines of ``claims`` in the file's order (by UID); forgets the claims not among them."""
        kept: dict[str, tuple[PreparedClaim, str]] = {}
        for uid in sorted(claims):
            claim = claims[uid]
            known = self._lines.get(uid)
            kept[uid] = known if known is not None and known[0] is claim else \
                (claim, json.dumps(_entry(claim), separators=(",", ":")))
        self._lines = kept
        return [line for _, line in kept.values()]


def _entry(c: PreparedClaim) -> dict[str, Any]:
    return {"claim": {"namespace": c.claim.namespace, "name": c.claim.name, "uid": c.claim.uid},
            "pod": list(c.pod), "pod_uid": c.pod_uid, "shares": [vars(s) for s in c.shares], "cdi_id": c.cdi_id}


def decode(text: str) -> dict[str, PreparedClaim]:
    """UID → prepared claim; ``ValueError`` saying what is wrong."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"expected a JSON object with version {FORMAT_VERSION}")
    out: dict[str, PreparedClaim] = {}
    for raw in doc.get("claims", []):
        claim = _claim(raw)
        out[claim.claim.uid] = claim
    return out


def _claim(raw: Any) -> PreparedClaim:
    try:
        ref = ClaimRef(**raw["claim"])
        shares = tuple(AllocatedShare(**s) for s in raw["shares"])
        pod = (str(raw["pod"][0]), str(raw["pod"][1]))
        prepared = PreparedClaim(ref, pod, str(raw["pod_uid"]), shares, str(raw["cdi_id"]))
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"a claim entry is malformed ({exc!r})") from None
    if not ref.uid or not all(isinstance(s.card, int) for s in shares):
        raise ValueError(f"the entry of claim {ref} is malformed")
    return prepared


def load(path: str) -> dict[str, PreparedClaim]:
    """The claims in ``path``; none when the file does not exist yet."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CheckpointError(f"cannot read the DRA checkpoint {path}: {exc}") from None
    try:
        return decode(text)
    except ValueError as exc:
        raise CheckpointError(
            f"the DRA checkpoint {path} is not readable: {exc}. It lists the claims this node prepared; "
            f"move it away to start empty (the claims prepared before are then unknown to the agent: "
            f"their CDI specs stay in the CDI directory until removed by hand)") from None


def save(path: str, claims: Mapping[str, PreparedClaim], kept: KeptLines | None = None) -> None:
    """Write ``claims`` to ``path`` atomically: a reader sees the old claims or the new (mode 0644;
    renamed, not fsync'ed). ``kept``: the lines of the claims saved before (:class:`KeptLines`)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    replace_file(path, encode(claims, kept), mode=0o644)
