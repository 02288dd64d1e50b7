"""The reclaims in progress, on disk, so that an agent killed mid-reclaim finishes it after a restart.

A reclaim is written here before any process of the pod is signalled, and each step it passes is
written again: ``recorded`` (decided, nothing sent yet), ``signalled`` (the checkpoint signal went
out, with the wall-clock time, so the restarted agent keeps the pod's deadline instead of granting
a new one or signalling twice), ``deadline-passed`` (what is left is killed next), ``stopped`` (no
process left; the lent devices are withdrawn next), ``evicted`` (the API was asked). Without the
journal, an agent killed between the owner's return and the end of the reclaim came back with the
loan gone (or still in ``lending.json``) and nothing left to stop the borrower, which kept running
beside the owner while the card was lent again.

When the reclaim is done its record leaves the reclaims in progress, and the pod (namespace, name,
UID) is kept in a second list, ``reclaimed``, until the pod watch no longer lists it: an evicted pod
stays on the node until kubelet has stopped it and it is deleted (a bare pod stays ``Failed`` until
someone deletes it), and meanwhile none of its containers may start again and it is never reclaimed
a second time, also after a restart of the agent (issue 26).

The file (``reclaims.json`` next to ``lending.json``) is written atomically
(:mod:`~gpupool.nodeagent.lending.durable`). A file that cannot be read is reported once as
unreadable (the service then lends nothing it cannot vouch for: docs/lending.md, Faults), never a
crash; a record that cannot be read is dropped from the result with its reason and the whole load
is marked unreadable, since the card it named is unknown. An entry of ``reclaimed`` that cannot be
read is dropped and logged, but marks nothing unreadable: it names no card and no reclaim left to
finish (at worst that pod's restarts are no longer refused). An agent older than the list ignores it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

from gpupool.nodeagent.lending.durable import write_json_atomically
from gpupool.nodeagent.lending.rules import PodKey

log = logging.getLogger(__name__)

JOURNAL_VERSION = 1
JOURNAL_FILE = "reclaims.json"


class ReclaimStep(IntEnum):
    """How far a reclaim got; a restarted agent goes on from the step after it."""

    RECORDED = 0
    SIGNALLED = 1
    DEADLINE_PASSED = 2
    STOPPED = 3
    EVICTED = 4

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, text: str) -> ReclaimStep:
        return cls[str(text).upper().replace("-", "_")]


@dataclass(frozen=True)
class ReclaimRecord:
    """One reclaim in progress: whose processes, why, on which card, and how far it got."""

    pod: PodKey
    uid: str
    container_ids: frozenset[str]
    why: str
    deadline_s: float
    card: int | None
    """The card the reclaim gives back (``None``: not known, e.g. an open of a card the agent does not serve)."""
    returned: bool
    """Whether the card's owner came back (its loan ended): the card is not lent until it is idle again."""
    step: ReclaimStep = ReclaimStep.RECORDED
    signalled_at: float | None = None
    """Wall-clock time the checkpoint signal was sent (``None`` before)."""

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.pod[0], "pod": self.pod[1], "uid": self.uid,
                "containerIDs": sorted(self.container_ids), "why": self.why, "deadlineSeconds": self.deadline_s,
                "card": self.card, "returned": self.returned, "step": self.step.label,
                "signalledAt": self.signalled_at}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ReclaimRecord:
        card, signalled = raw["card"], raw.get("signalledAt")
        ids = raw["containerIDs"]
        if not isinstance(ids, list):
            raise TypeError("containerIDs is not a list")
        return cls((str(raw["namespace"]), str(raw["pod"])), str(raw["uid"]), frozenset(str(i) for i in ids),
                   str(raw["why"]), float(raw["deadlineSeconds"]), None if card is None else int(card),
                   bool(raw["returned"]), ReclaimStep.parse(raw["step"]),
                   None if signalled is None else float(signalled))


@dataclass(frozen=True)
class JournalLoad:
    """What the previous agent left: the readable records, and whether anything could not be read."""

    records: tuple[ReclaimRecord, ...] = ()
    unreadable: str = ""
    """Why (part of) the file could not be read; empty when it was read whole or was absent."""
    reclaimed: Mapping[PodKey, str] = field(default_factory=dict)
    """Pods whose reclaim finished, still on the node when the file was written: pod → UID."""


class ReclaimJournal:
    """The reclaims in progress and their file; every method may be called from any thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._records: dict[PodKey, ReclaimRecord] = {}
        self._reclaimed: dict[PodKey, str] = {}

    def load(self) -> JournalLoad:
        """Read the previous agent's file and keep its readable records (they are this journal's now)."""
        records, problems, reclaimed = self._read()
        with self._lock:
            self._records = {r.pod: r for r in records}
            self._reclaimed = dict(reclaimed)
        unreadable = "; ".join(problems)
        if unreadable:
            log.error("the reclaim journal %s is unreadable in part or whole (%s); %d reclaim(s) read", self.path,
                      unreadable, len(records))
        return JournalLoad(tuple(records), unreadable, dict(reclaimed))

    def records(self) -> list[ReclaimRecord]:
        with self._lock:
            return list(self._records.values())

    def cards(self) -> set[int]:
        """The cards a reclaim in progress gives back (not to be lent meanwhile)."""
        with self._lock:
            return {r.card for r in self._records.values() if r.card is not None}

    def get(self, pod: PodKey) -> ReclaimRecord | None:
        with self._lock:
            return self._records.get(pod)

    def begin(self, records: list[ReclaimRecord]) -> None:
        """Record new reclaims (before anything is signalled); a pod already recorded keeps its record."""
        with self._lock:
            for record in records:
                self._records.setdefault(record.pod, record)
            self._save()

    def advance(self, pod: PodKey, step: ReclaimStep, signalled_at: float | None = None) -> None:
        """A reclaim passed ``step`` (a step never goes back)."""
        with self._lock:
            record = self._records.get(pod)
            if record is None or record.step >= step:
                return
            self._records[pod] = replace(record, step=step, signalled_at=signalled_at if signalled_at is not None
                                         else record.signalled_at)
            self._save()

    def finish(self, pod: PodKey) -> ReclaimRecord | None:
        """The reclaim is done: it leaves the reclaims in progress, and the pod (when its UID is known)
        is kept among the reclaimed until :meth:`keep_reclaimed` no longer finds it; returns its record."""
        with self._lock:
            record = self._records.pop(pod, None)
            if record is not None:
                if record.uid:
                    self._reclaimed[pod] = record.uid
                self._save()
            return record

    def reclaimed(self) -> dict[PodKey, str]:
        """Pods whose reclaim finished and that may still be on the node: pod → UID."""
        with self._lock:
            return dict(self._reclaimed)

    def keep_reclaimed(self, listed: Mapping[PodKey, str]) -> None:
        """Forget the reclaimed pods that left the node: those ``listed`` (every pod the watch has,
        pod → UID, after a full list) does not name with the same UID (a new pod of the same name is
        another pod)."""
        with self._lock:
            kept = {pod: uid for pod, uid in self._reclaimed.items() if listed.get(pod) == uid}
            if kept != self._reclaimed:
                self._reclaimed = kept
                self._save()

    def _save(self) -> None:
        doc = {"version": JOURNAL_VERSION,
               "reclaims": [r.to_json() for r in sorted(self._records.values(), key=lambda r: r.pod)],
               "reclaimed": [{"namespace": ns, "pod": name, "uid": uid}
                             for (ns, name), uid in sorted(self._reclaimed.items())]}
        try:
            write_json_atomically(self.path, doc)
        except OSError as exc:  # the reclaim goes on; only a restart in this state loses it
            log.error("cannot write the reclaim journal %s: %s", self.path, exc)

    def _read(self) -> tuple[list[ReclaimRecord], list[str], dict[PodKey, str]]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except FileNotFoundError:
            return [], [], {}
        except (OSError, ValueError) as exc:
            return [], [f"{type(exc).__name__}: {exc}"], {}
        if not isinstance(doc, dict) or doc.get("version") != JOURNAL_VERSION:
            version = doc.get("version") if isinstance(doc, dict) else None
            return [], [f"not a version {JOURNAL_VERSION} journal (version {version!r})"], {}
        reclaimed = self._read_reclaimed(doc.get("reclaimed", []))
        raw = doc.get("reclaims")
        if not isinstance(raw, list):
            return [], ["no list of reclaims"], reclaimed
        records, problems = [], []
        for i, item in enumerate(raw):
            try:
                if not isinstance(item, dict):
                    raise TypeError("not an object")
                records.append(ReclaimRecord.from_json(item))
            except (KeyError, TypeError, ValueError) as exc:
                problems.append(f"reclaim {i}: {type(exc).__name__}: {exc}")
        return records, problems, reclaimed

    def _read_reclaimed(self, raw: Any) -> dict[PodKey, str]:
        """The ``reclaimed`` list; what cannot be read is logged and left out (see the module)."""
        if not isinstance(raw, list):
            log.error("the reclaim journal %s: 'reclaimed' is not a list; ignored", self.path)
            return {}
        found: dict[PodKey, str] = {}
        for i, item in enumerate(raw):
            try:
                if not isinstance(item, dict):
                    raise TypeError("not an object")
                namespace, name, uid = (item[k] for k in ("namespace", "pod", "uid"))
                if not all(isinstance(v, str) and v for v in (namespace, name, uid)):
                    raise ValueError("namespace, pod and uid must be non-empty strings")
                found[(namespace, name)] = uid
            except (KeyError, TypeError, ValueError) as exc:
                log.error("the reclaim journal %s: reclaimed pod %d unreadable (%s: %s); ignored", self.path, i,
                          type(exc).__name__, exc)
        return found
