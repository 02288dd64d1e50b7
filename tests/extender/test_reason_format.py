"""Every text kube-scheduler shows for the extender reads as written: no ``%`` reaches it.

kube-scheduler (v1.35-v1.37, ``pkg/scheduler/schedule_one.go``) records the pod's ``FailedScheduling``
event with ``Eventf(pod, nil, Warning, "FailedScheduling", "Scheduling", msg)``: the message, which
holds the extender's ``FailedNodes`` reasons (or a filter's or bind's ``Error``), is the *format
string* of Go's ``fmt.Sprintf``, with no arguments. So ``30% compute`` arrived as
``30%!c(MISSING)ompute`` in ``kubectl describe``, and an escaped ``%%`` would read ``%`` there but
``%%`` in the pod's ``PodScheduled`` condition, which keeps the raw text. Only a text without ``%``
reads the same in both, which these tests hold: gpupool's own texts write "percent", and the wire
(:mod:`gpupool.extender.http.wire`) replaces a ``%`` in anything else (a model name, an annotation).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gpupool.core.feasibility import explain_node, request_problem
from gpupool.core.model import GpuKind, GpuRequest
from gpupool.core.quota import Limits, Quota, quota_verdict
from gpupool.core.state import ClusterState
from gpupool.core.usage import Amounts
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.wire import SAFE_PERCENT, FilterResult, binding_result, format_safe, format_safe_reasons
from gpupool.kube.refusal_texts import alias_problem
from gpupool.testing.fake_api import FakePodApi
from tests.core.builders import book_slice, make_node, pod_with
from tests.extender.http_world import ALIBABA_NODES, args, post, run
from tests.extender.modes import EVERY_FIT
from tests.kube.builders import container, node, pod

ROOT = Path(__file__).resolve().parents[2]
REASON_SOURCES = ("gpupool/core", "gpupool/api", "gpupool/kube", "gpupool/extender")
"""Packages whose texts become filter reasons, ``Error`` texts or parts of them."""
LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}
TIME_FORMATS = {"strftime", "strptime"}
GUARDS = {"format_safe", "format_safe_reasons"}
"""The wire's functions that replace the sign (:mod:`gpupool.extender.http.wire`)."""


def go_sprintf_without_args(text: str) -> str:
    """What Go's ``fmt.Sprintf(text)`` gives, as kube-scheduler's ``Eventf`` calls it: ``%%`` is ``%``,
    any other verb has no operand and reads ``%!<verb>(MISSING)`` (flags, width and precision are
    read over first, so ``% c`` is the verb ``c`` with the space flag). Enough to tell whether a text
    comes through unchanged."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "%":
            out.append(text[i])
            i += 1
            continue
        i += 1
        while i < len(text) and text[i] in "+-# 0":
            i += 1
        while i < len(text) and (text[i].isdigit() or text[i] in ".*[]"):
            i += 1
        if i == len(text):
            out.append("%!(NOVERB)")
            break
        verb = text[i]
        i += 1
        out.append("%" if verb == "%" else f"%!{verb}(MISSING)")
    return "".join(out)


def test_the_go_rendering_garbles_what_users_saw() -> None:
    """The emulation reproduces the reports: a reason with a ``%`` does not come through."""
    assert go_sprintf_without_args("no card has 30% compute free") == "no card has 30%!c(MISSING)ompute free"
    assert go_sprintf_without_args("limit 150%, used") == "limit 150%!,(MISSING) used"
    assert go_sprintf_without_args("50%% of a card") == "50% of a card"
    assert go_sprintf_without_args("no % here") == "no %!h(MISSING)ere"
    assert go_sprintf_without_args("30 percent, 25 percent") == "30 percent, 25 percent"


# ------------------------------------------------------------------------- gpupool's own texts
def _skipped_constants(tree: ast.AST) -> set[int]:
    """Constants whose ``%`` is not text for a reader: docstrings (of modules, classes, functions and
    attributes), logging formats, time formats, and the wire's guard looking for the sign."""
    skipped: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant):
            skipped.add(id(n.value))
        if isinstance(n, ast.FunctionDef) and n.name in GUARDS:
            skipped.update(id(c) for c in ast.walk(n) if isinstance(c, ast.Constant))
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args
                and n.func.attr in LOG_METHODS | TIME_FORMATS):
            fmt = n.args[1] if n.func.attr == "log" and len(n.args) > 1 else n.args[0]
            skipped.update(id(c) for c in ast.walk(fmt) if isinstance(c, ast.Constant))
    return skipped


@pytest.mark.slow
def test_no_text_of_the_reason_sources_has_a_percent_sign() -> None:
    """Every string literal (f-string parts too) of the packages that word reasons: a ``%`` is a
    log line's or a time's format, never a text (write "percent")."""
    found = []
    for package in REASON_SOURCES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            skipped = _skipped_constants(tree)
            found += [f"{path.relative_to(ROOT)}:{c.lineno}: {c.value!r}" for c in ast.walk(tree)
                      if isinstance(c, ast.Constant) and isinstance(c.value, str) and "%" in c.value
                      and id(c) not in skipped]
    assert found == []


def core_refusals() -> list[str]:
    """One reason of each kind the core words for a filter (``explain_node``, ``request_problem``,
    the quota verdict), with shares that used to be written with ``%``."""
    state = ClusterState([make_node("n", 2)])
    book_slice(state, "a", "n", 0, compute=750)
    book_slice(state, "b", "n", 1, compute=900)
    requests = [GpuRequest(compute=300, memory_mib=10), GpuRequest(count=2, compute=0, memory_mib=16_385),
                GpuRequest(compute=0, memory_mib=16_385), GpuRequest.whole(2),
                GpuRequest(compute=100, memory_mib=10, kind=GpuKind.VIRTUAL),
                GpuRequest(compute=100, memory_mib=10, models=frozenset({"B"}))]
    texts = [explain_node(state, 0, pod_with("p", r)) for r in requests]
    texts.append(explain_node(state, 0, pod_with("p", GpuRequest(compute=100, memory_mib=10), cpu=10**8)))
    texts += [request_problem(state, pod_with("p", r)) for r in
              (GpuRequest.whole(9), GpuRequest(compute=0, memory_mib=10**6),
               GpuRequest(compute=100, memory_mib=10, models=frozenset({"C"})))]
    quota = Quota("team/gpus", "team", Limits(memory_mib=1000, compute=1500, cards=1))
    texts += [quota_verdict([quota], {}, {"T4": asked}) for asked in
              (Amounts(10, 1600, 0), Amounts(2000, 0, 0), Amounts(0, 0, 2))]
    texts.append(alias_problem(frozenset({"aliyun.com/gpu-mem"}), frozenset()))
    return [t for t in texts if t is not None]


def test_the_cores_refusals_read_the_same_after_go_formatting() -> None:
    texts = core_refusals()
    assert len(texts) >= 14 and any("percent" in t for t in texts)
    assert {t: go_sprintf_without_args(t) for t in texts} == {t: t for t in texts}


# ---------------------------------------------------------------- anything else, at the wire
def test_the_wire_replaces_a_percent_it_did_not_write() -> None:
    assert format_safe("model A100 50%") == f"model A100 50{SAFE_PERCENT}"
    reasons = {"n1": "plain", "n2": "node has T4 %s"}
    assert format_safe_reasons(reasons) == {"n1": "plain", "n2": f"node has T4 {SAFE_PERCENT}s"}
    plain = {"n1": "plain"}
    assert format_safe_reasons(plain) is plain
    doc = FilterResult(failed=reasons, error="30% c").to_json(None)
    assert doc["FailedNodes"]["n2"] == go_sprintf_without_args(doc["FailedNodes"]["n2"])
    assert doc["Error"] == f"30{SAFE_PERCENT} c"
    assert binding_result("pod 100% gone") == {"Error": f"pod 100{SAFE_PERCENT} gone"}


def _assert_shown_as_sent(body: dict[str, Any]) -> None:
    texts = [body["Error"], *(body["FailedNodes"] or {}).values()]
    assert [t for t in texts if go_sprintf_without_args(t) != t] == []


@pytest.mark.parametrize("full", [False, True], ids=["node-names", "node-objects"])
def test_a_filter_answer_carries_no_percent_sign(full: bool) -> None:
    """A node whose inventory names a model with ``%`` is refused with a reason naming it, and so is
    every node for a pod asking for a model with ``%``; both answer modes (the fast NodeNames writer
    and the Node objects one) send them Go-safe."""
    odd = node("N4", [16276], model="T4 50%c")
    wanted = pod("p", container(mib=1))
    wanted["metadata"]["annotations"]["gpupool.io/gpu-models"] = "Tesla-V100"

    async def scenario(client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        _status, body = await post(client, "/filter", args(wanted, ["N3", "N4"], full=full))
        assert f"T4 50{SAFE_PERCENT}c" in body["FailedNodes"]["N4"]
        _assert_shown_as_sent(body)
        missing = pod("q", container(mib=1))
        missing["metadata"]["annotations"]["gpupool.io/gpu-models"] = "A100-50%"
        _status, body = await post(client, "/filter", args(missing, ["N3", "N4"], full=full))
        assert f"asks for GPU model(s) A100-50{SAFE_PERCENT}; the cluster has T4 50{SAFE_PERCENT}c" in \
            body["FailedNodes"]["N3"]
        _assert_shown_as_sent(body)

    run(scenario, settings=EVERY_FIT, nodes=[*ALIBABA_NODES, odd])
