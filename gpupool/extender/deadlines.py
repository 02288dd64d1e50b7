"""The extender's deadlines against kube-scheduler's ``httpTimeout`` for it.

kube-scheduler gives up on an extender call after ``httpTimeout`` (its configuration's
``extenders[].httpTimeout``, a Go duration such as ``10s``). A bind that may run longer than that
(``--bind-deadline``) can still succeed after kube-scheduler has reported it failed and retried the
pod elsewhere; a filter's assumed booking that expires sooner than it (``--assume-deadline``) frees
cards whose bind is still coming. Both live in the extender's flags, the timeout in the scheduler's
ConfigMap, so :func:`deadline_problems` is the one statement of how they must relate; the deploy
tests apply it to every shipped scheduler configuration (docs/cluster-config.md).
"""

from __future__ import annotations

import re

_GO_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(h|m|s|ms|us|µs|ns))+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def go_duration_s(text: str) -> float:
    """Seconds of a Go duration (``10s``, ``1m30s``, ``500ms``); ``ValueError`` for anything else."""
    if not _GO_DURATION.match(text):
        raise ValueError(f"not a duration such as 10s or 1m30s: {text!r}")
    return sum(float(number) * _UNIT_S[unit] for number, unit in _PART.findall(text))


def deadline_problems(http_timeout_s: float, bind_deadline_s: float, assume_s: float) -> list[str]:
    """What is wrong between kube-scheduler's ``httpTimeout`` and the extender's deadlines (empty: nothing)."""
    problems = []
    if bind_deadline_s >= http_timeout_s:
        problems.append(f"the extender's --bind-deadline ({bind_deadline_s:g} s) is not below kube-scheduler's "
                        f"httpTimeout ({http_timeout_s:g} s): a bind may finish after kube-scheduler gave up on it")
    if assume_s < http_timeout_s:
        problems.append(f"the extender's --assume-deadline ({assume_s:g} s) is below kube-scheduler's httpTimeout "
                        f"({http_timeout_s:g} s): a filter's booking may lapse while its bind is still coming")
    return problems
