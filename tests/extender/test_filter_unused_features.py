"""A ``/filter`` of a pod that uses none of gpupool's optional features does not call into them.

The filter of a plain pod (no virtual cards, no tenancy object that reaches it, no unreadable
claim in the cluster) asks each of these one cheap question in the caller instead of calling the
feature's module to learn that nothing applies (issue 22's file-count walk, docs/architecture.md):

* the virtual-card rule (``gpupool.core.virtual_cards.wants_one_card``): ``request.virtual`` is None;
* the reasons of nodes outside the pod's group or pools (``gpupool.kube.refusal_texts.with_outside``):
  no layer refused a node;
* the booking problems' unreadable claims (``BookingProblems.clear_unreadable``): the pod holds none.

Here each of them fails if called, and the filter must still pass and book one node. That the
features still apply when in use is pinned where they are tested: ``tests/core/test_virtual_cards.py``,
``tests/extender/test_tenancy_filter.py`` (nodes outside a group, with their reasons) and
``tests/extender/test_adopted_pods.py`` / ``test_bookings.py`` (unreadable claims and their clearing).
"""

from __future__ import annotations

from typing import Any, NoReturn

import pytest

import gpupool.core.cards as cards_module
import gpupool.extender.service as service_module
from gpupool.extender.booking_problems import BookingProblems
from gpupool.extender.bookings import Stage
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import ExtenderService
from gpupool.kube.translate import pod_request
from tests.kube.builders import container, node, pod

NAMES = ["node-0", "node-1", "node-2"]


def _not_on_this_path(*_: Any, **__: Any) -> NoReturn:
    raise AssertionError("a feature the pod does not use was called on the filter's path")


def test_a_plain_pods_filter_calls_no_unused_feature(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node(name, [16384, 16384]) for name in NAMES])
    cache.replace_pods([])
    service = ExtenderService(cache, None)  # the shipped settings: one best node, booked
    monkeypatch.setattr(cards_module, "wants_one_card", _not_on_this_path)
    monkeypatch.setattr(service_module, "with_outside", _not_on_this_path)
    monkeypatch.setattr(BookingProblems, "clear_unreadable", _not_on_this_path)
    obj = pod("p", container(gpu_mem=16))
    outcome = service.filter(pod_request(obj, cache.names), NAMES, pod=obj)
    assert outcome.error == ""
    assert len(outcome.passed) == 1
    assert cache.keeper.bookings["default/p"].stage is Stage.ASSUMED
