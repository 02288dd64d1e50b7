"""A cluster whose node n1 lends card 0: its owner holds it whole and idles (for the extender's
lending tests and ``bench/lending_filter.py``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpupool.api.lending import Lendable, LendableCard, LendingNames, encode_lendable
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import ExtenderService, ExtenderSettings
from gpupool.testing.fake_api import FakePodApi
from gpupool.testing.kube_objects import container, node, placed_pod, pod

CARD = 16276
LENT_MIB = 12000
OWNER = "default/owner"
NAMES = LendingNames()
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def lendable(*cards: tuple[int, int], uuid_node: str = "n1") -> str:
    """The annotation value lending ``(card index, MiB)`` pairs, all owned by :data:`OWNER`."""
    return encode_lendable(Lendable(1.0, tuple(LendableCard(index, f"GPU-{uuid_node}-{index}", OWNER, "main", mib,
                                                            100, 0.0) for index, mib in cards)))


def lending_node(name: str = "n1", lent: str | None = None, cards: int = 1) -> dict[str, Any]:
    raw = node(name, [CARD] * cards)
    raw["metadata"]["annotations"][NAMES.lendable] = lent if lent is not None else lendable((0, LENT_MIB))
    return raw


def waiting(name: str, mib: int, *, age_s: int = 0, priority: int = 0, controlled: bool = True,
            borrow: str | None = None) -> dict[str, Any]:
    """A pending pod asking ``mib`` on one card, created ``age_s`` seconds after :data:`START`."""
    raw = pod(name, container(mib=mib))
    raw["spec"]["priority"] = priority
    raw["metadata"]["creationTimestamp"] = (START + dt.timedelta(seconds=age_s)).isoformat()
    if controlled:
        raw["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                               "uid": "rs-uid", "controller": True}]
    if borrow is not None:
        raw["metadata"]["annotations"][NAMES.borrow] = borrow
    return raw


def owner() -> dict[str, Any]:
    return placed_pod("owner", "n1", 0, CARD)


def lending_world(*pods: dict[str, Any], nodes: list[dict[str, Any]] | None = None,
                  settings: ExtenderSettings | None = None) -> tuple[FakePodApi, ClusterCache, ExtenderService]:
    """n1 lends card 0 (its owner holds it whole); ``pods`` exist in the API and the cache.
    ``settings``: the service's mode (default: the shipped one)."""
    api = FakePodApi()
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes(nodes if nodes is not None else [lending_node()])
    for raw in (owner(), *pods):
        api.create_pod(raw)
    cache.replace_pods(api.list_pods())
    api.listeners.append(lambda kind, p: cache.remove_pod(p) if kind == "DELETED" else cache.upsert_pod(p))
    return api, cache, ExtenderService(cache, Binder(cache, api), settings=settings)
