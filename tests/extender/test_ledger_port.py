"""The service's ``Ledger`` port holds what the four verbs use, and nothing else.

A ledger written from the port alone (:class:`PortOnlyLedger`, no cache, no Kubernetes) answers
filter, prioritize, bind and preempt; its members are exactly the port's, so a verb that reached
for something else of the cache (a metric's count, the tenancy book, the request memo) would fail
here with an ``AttributeError``. ``mypy --strict`` checks that it implements the port
(:func:`test_the_port_only_ledger_type_checks_as_the_services_ledger`). The figures ``/metrics``
reads are a protocol of their own, which the concrete cache implements and the port does not carry.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpupool.api.tenancy import TenancyNames
from gpupool.core.fragmentation import FloatArray, WorkloadProfile
from gpupool.core.lent_view import PolicyFactory
from gpupool.core.model import Placement, PodRequest
from gpupool.core.policies import PlacementPolicy, make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState, IntArray
from gpupool.extender.cache import ClusterCache
from gpupool.extender.metrics import LedgerFigures
from gpupool.extender.service import BindResult, ExtenderService, Ledger
from gpupool.extender.victims import HeldClaim, Holder
from gpupool.kube.tenancy import PodTenancy
from gpupool.kube.tenancy_book import TenancyBook
from gpupool.kube.tenancy_layers import Admission, Admissions
from tests.core.builders import make_node, mem_pod

PORT_MEMBERS = {
    "lock", "state", "admissions", "profile", "new_policy", "key_for_uid", "holders_on", "unreadable_on",
    "claims", "scheduler", "node_problems", "share_refusals", "served_aliases", "served_aliases_version",
    "soft_tainted", "synced", "claim_problems", "lending", "admit", "assume", "unassume", "drop_lapsed",
    "pinned_node",
}
"""The port's members (preempt's reads, then the filter's): 23 (``claims``: a claim pod's victims
free its DRA claims; ``pinned_node``: a pod whose earlier bind's write the watch has not shown is
passed that node alone), where it had grown to 25 with the metrics' counts and the tenancy book
(``admit``: the filter's admission, which skips the tenancy layers for a pod no tenancy object reaches)."""

METRICS_ONLY = {"problems", "released_bookings", "assumed_pods", "assumption_ends", "tenancy"}


class NoLoans:
    """Lent capacity nowhere: every pod that fits no owned capacity fits nothing."""

    def place(self, state: ClusterState, request: PodRequest, rows: IntArray, policy: PolicyFactory,
              profile: WorkloadProfile | None, explain_limit: int,
              pod: Mapping[str, Any] | None = None) -> tuple[IntArray, FloatArray, dict[int, str]]:
        return np.zeros(0, dtype=np.int64), np.zeros(0), {}


class NoClaims:
    """No DRA claims booked anywhere."""

    def held_on(self, node: str) -> list[HeldClaim]:
        return []


class PortOnlyLedger:
    """A ledger with the port's members only, over a core state (what a service test can fake)."""

    def __init__(self, *nodes: str) -> None:
        self.lock = threading.RLock()
        self.state = ClusterState()
        for name in nodes:
            self.state.upsert_node(make_node(name, 1))
        self.admissions = Admissions(TenancyBook(TenancyNames()))
        self.profile: WorkloadProfile | None = None
        self.scheduler = Scheduler(self.state, self.new_policy())
        self.node_problems: dict[str, str] = {}
        self.share_refusals: dict[str, str] = {}
        self.served_aliases: dict[str, frozenset[str]] = {}
        self.served_aliases_version = 0
        self.soft_tainted: set[str] = set()
        self.lending = NoLoans()
        self.claims = NoClaims()
        self.assumed: dict[str, Placement] = {}
        self.ended: list[tuple[str, str]] = []

    @property
    def synced(self) -> bool:
        return True

    @property
    def claim_problems(self) -> dict[str, str]:
        return {}

    def new_policy(self) -> PlacementPolicy:
        return make_policy("binpack")

    def key_for_uid(self, uid: str) -> str | None:
        return None

    def holders_on(self, node: str) -> list[Holder]:
        return []

    def unreadable_on(self, node: str) -> frozenset[str]:
        return frozenset()

    def admit(self, request: PodRequest, tenant: PodTenancy | None, node: str | None = None) -> Admission:
        return self.admissions.admit(self.state, request, tenant, node=node)

    def assume(self, asked: PodRequest, admission: Admission, node: str, hold_s: float) -> Placement | None:
        placed = self.scheduler.assign(admission.request, node)
        if not isinstance(placed, Placement):
            return None
        self.state.apply(placed)
        self.assumed[asked.key] = placed
        return placed

    def unassume(self, key: str, why: str) -> None:
        if self.assumed.pop(key, None) is not None:
            self.state.release(key)
            self.ended.append((key, why))

    def drop_lapsed(self) -> list[str]:
        return []

    def pinned_node(self, key: str, uid: str = "") -> str | None:
        return None


class NoBinds:
    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        return BindResult(placement=None)


def public_members(cls: type) -> set[str]:
    """The members a class declares (annotations and attributes), without the dunder machinery."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass in (object,) or klass.__name__ in ("Protocol", "Generic"):
            continue
        names |= {n for n in vars(klass) if not n.startswith("_")}
        names |= {n for n in getattr(klass, "__annotations__", {}) if not n.startswith("_")}
    return names


def test_the_port_declares_what_the_service_calls_and_no_metric() -> None:
    assert public_members(Ledger) == PORT_MEMBERS
    assert not public_members(Ledger) & METRICS_ONLY


def test_the_figures_a_scrape_reads_are_apart_from_the_port() -> None:
    figures = public_members(LedgerFigures)
    assert {"problems", "released_bookings", "assumed_pods", "assumption_ends"} <= figures
    assert not figures - public_members(ClusterCache) - set(vars(ClusterCache()))  # the cache has them all


def test_the_four_verbs_run_on_a_ledger_of_the_port_alone() -> None:
    ledger = PortOnlyLedger("n1", "n2")
    service = ExtenderService(ledger, NoBinds())
    assert not service.unready()
    big, small = mem_pod("default/big", 12_288), mem_pod("default/small", 8_192)
    first = service.filter(big, ["n1", "n2", "gone"])
    assert len(first.passed) == 1 and first.failed["gone"] == "node is not in the gpupool extender's cache"
    assert set(ledger.assumed) == {"default/big"}  # the one node it passed holds it until its bind
    taken = first.passed[0]
    second = service.filter(small, ["n1", "n2"])
    assert second.passed == [n for n in ("n1", "n2") if n != taken]  # the assumption is on the ledger
    scores, error = service.prioritize(small, second.passed)
    assert not error and scores.hosts == second.passed
    assert service.bind("default", "big", "uid-big", taken).ok
    assert ("default/big", "refused") in ledger.ended  # the bind ended the filter's assumption
    victims, error = service.preempt(small, {"n1": [], "n2": []})
    assert not error and victims == {}  # nobody to evict: nodes without victims are left out


def test_the_port_only_ledger_has_no_member_beyond_the_port() -> None:
    declared = {n for n in vars(PortOnlyLedger) if not n.startswith("_")} | set(vars(PortOnlyLedger("n1")))
    assert declared - {"assumed", "ended"} == PORT_MEMBERS  # its own bookkeeping aside


def mypy_cache_dir() -> Path:
    """mypy's incremental cache for this check, kept between runs beside scripts/test-all's own
    (``$XDG_CACHE_HOME/gpupool``): a cold check reads the whole package (6-10 s), a warm one only what
    changed (0.5 s). mypy trusts an entry only while its file's hash is unchanged and writes each entry
    atomically, so a stale or concurrent run cannot make the check pass wrongly. Options other than
    scripts/test-all's (``--follow-imports=silent``) keep it apart from that cache."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpupool" / "mypy-port-check"


@pytest.mark.slow
def test_the_port_only_ledger_type_checks_as_the_services_ledger(tmp_path: Path) -> None:
    """mypy --strict accepts the port-only ledger where the service takes its :class:`Ledger`."""
    check = tmp_path / "port_check.py"
    check.write_text("from gpupool.extender.service import Ledger\n"
                     "from tests.extender.test_ledger_port import PortOnlyLedger\n\n"
                     "ledger: Ledger = PortOnlyLedger('n1')\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--cache-dir", str(mypy_cache_dir()), str(check)],
                          cwd=root, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
