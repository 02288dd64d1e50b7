"""Admission of one pod under the tenancy objects: its group, its namespace's quotas and pools, its
own card controls, as restrictions on the cards its request may use.

Every restriction is a *layer*: a :class:`CardScope` and the sentence for a node where the layer
leaves no card. The pod's request is narrowed by all layers at once (so the core's masks, card
choice and ledger check keep it there, see :mod:`gpupool.core.card_scope`), and the filter words a
refused node by the first layer that leaves it nothing. Layers, in order:

1. its resource group (the pod label, else its namespace's default groups: the best-fitting one of
   those it may use, see :func:`gpupool.core.groups.choose_group`), or, for a pod without a group,
   every card no unshared group reserves;
2. the pools each quota of its namespace allows (node label values);
3. the GPUs its annotations pin or avoid, and the models they avoid;
4. (filter only) the GPU models on which a quota of its namespace has no room left for it, by the
   estimate of :func:`gpupool.core.quota.refused_models`. The bind checks the exact placement
   instead (:meth:`Admission.quota_check`), under the ledger's lock and in the same step as it
   books the cards, so two racing binds cannot both pass a quota.

Groups are compiled against the ledger (a listed GPU must be on its node; one that is not is left
out of the group and reported) and kept until the tenancy objects or the node layout change.

Why in ``kube`` and not in the extender: ``kubectl gpupool why`` admits the pod it explains with
this same code over its own one-time read of the cluster, so its sentences are the filter's.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpupool.api.tenancy import ResourceGroup
from gpupool.core.card_scope import CardScope, CardSet, narrow
from gpupool.core.groups import Group, choose_group, outside_scope, scoped
from gpupool.core.model import Placement, PodRequest
from gpupool.core.quota import ModelSizes, Quota, quota_verdict, refused_everywhere, refused_models, refused_text
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.core.usage import placement_use
from gpupool.kube.tenancy import PodTenancy
from gpupool.kube.tenancy_book import TenancyBook

log = logging.getLogger(__name__)

QuotaCheck = Callable[[Placement], "str | None"]
ObjectArray = npt.NDArray[np.object_]


@dataclass(frozen=True)
class Layer:
    """One restriction: the cards it leaves, and why a node where it leaves none is refused."""

    scope: CardScope
    reason: str


@dataclass(frozen=True)
class Admission:
    """A pod under the tenancy objects: its narrowed request, or an error refusing it everywhere."""

    request: PodRequest
    error: str | None = None
    layers: tuple[Layer, ...] = ()
    quotas: tuple[Quota, ...] = ()
    tenant: str = ""
    refusals: LayerRefusals | None = field(default=None, compare=False)

    def refuse_nodes(self, state: ClusterState, rows: IntArray, usable: BoolArray,
                     names: ObjectArray) -> list[dict[str, str]]:
        """Mark the usable nodes of ``rows`` (ledger rows of ``names``) where a layer leaves no card
        unusable; returns their reasons, per layer (nodes refused before keep their own reason)."""
        refusals = self.refusals or LayerRefusals()
        found: list[dict[str, str]] = []
        for layer in self.layers:
            lacking, reasons = refusals.of(state, layer, rows, names)
            if not len(lacking):
                continue
            if usable[lacking].all():
                found.append(reasons)
            else:
                fresh = lacking[usable[lacking]]
                found.append(dict.fromkeys(names[fresh].tolist(), layer.reason))
            usable[lacking] = False
        return found


    def node_refusal(self, state: ClusterState, row: int) -> str | None:
        """The first layer's reason when it leaves node ``row`` no card (the bind's node check)."""
        for layer in self.layers:
            if not state.scope_reach(layer.scope)[row]:
                return layer.reason
        return None

    def quota_check(self, state: ClusterState) -> QuotaCheck | None:
        """The exact quota check of a placement, to run under the ledger's lock right before it is
        booked (None without quotas)."""
        if not self.quotas:
            return None
        quotas, tenant = self.quotas, self.tenant

        def check(placement: Placement) -> str | None:
            spec = state.specs[state.index[placement.node]]
            return quota_verdict(quotas, state.usage.of(tenant), placement_use(placement, spec))

        return check


class LayerRefusals:
    """Per layer and asked node list, the positions of the nodes it leaves without a card and their
    reasons as a ready dictionary. The pods of one group ask about the same 5,000 nodes again and
    again, and building a 5,000-entry dictionary per filter cost more than the rest of the
    admission; ``names`` is the service's long-lived array of the asked names, so its identity
    (with the node layout) says when the answer may have changed."""

    def __init__(self, kept: int = 128) -> None:
        self.kept = kept
        self._found: OrderedDict[tuple[CardScope, str, int, int],
                                 tuple[ObjectArray, IntArray, dict[str, str]]] = OrderedDict()

    def of(self, state: ClusterState, layer: Layer, rows: IntArray,
           names: ObjectArray) -> tuple[IntArray, dict[str, str]]:
        key = (layer.scope, layer.reason, id(names), state.layout_version)
        found = self._found.get(key)
        if found is not None and found[0] is names:  # the entry holds the array: its id stays its own
            self._found.move_to_end(key)
            return found[1], found[2]
        known = np.flatnonzero(rows >= 0)
        lacking: IntArray = known[~state.scope_reach(layer.scope)[rows[known]]]
        reasons = dict.fromkeys(names[lacking].tolist(), layer.reason)
        self._found[key] = (names, lacking, reasons)
        if len(self._found) > self.kept:
            self._found.popitem(last=False)
        return lacking, reasons


@dataclass(frozen=True)
class _Compiled:
    groups: dict[str, Group]
    outside: CardScope | None


class Admissions:
    """Admits pods against a :class:`TenancyBook` and a ledger (call under the cache's lock)."""

    def __init__(self, book: TenancyBook) -> None:
        self.book = book
        self.sizes = ModelSizes()
        self._compiled: tuple[tuple[int, int, int], _Compiled] | None = None
        self._pools: dict[tuple[int, int, frozenset[str]], CardScope] = {}
        self.group_problems: dict[str, str] = {}
        self.refusals = LayerRefusals()
        self.creators_checked = False
        """Whether the pod-group webhook (:mod:`gpupool.extender.group_subjects`) checks who creates or
        labels a pod naming a group (``--creator-subjects-webhook``): then a pod naming a group with
        User or Group subjects was admitted by them when it was created or labelled."""

    def _creator_checked(self, group: ResourceGroup, tenant: PodTenancy) -> bool:
        """A pod that names ``group`` in its label, admitted by the webhook's check of its creator
        (only User and Group subjects need it; the others are the pod's own)."""
        return self.creators_checked and group.names_creators and tenant.group == group.name

    def _creators_unchecked(self, group: ResourceGroup) -> str:
        if not group.names_creators:
            return ""
        if not self.creators_checked:
            return ("; its User and Group subjects are matched only by the extender's pod-group webhook, "
                    "which this extender does not rely on (--creator-subjects-webhook)")
        return "; its User and Group subjects admit only pods that name the group in their label"

    def admit(self, state: ClusterState, request: PodRequest, tenant: PodTenancy | None, *,
              node: str | None = None) -> Admission:
        """The pod's request narrowed by every layer (see the module doc). ``node``: a bind's node,
        which the group must contain (quota models are then left to the exact check)."""
        if tenant is None or not request.wants_gpu:
            return Admission(request)
        layers: list[Layer] = []
        problem = self._group_layer(state, request, tenant, node, layers)
        if problem is not None:
            return Admission(request, problem)
        quotas = self.book.quotas_of(tenant.namespace)
        for quota in quotas:
            if quota.pools:
                layers.append(Layer(self._pool_scope(state, quota.pools),
                                    f"node is not in a pool GpuQuota {quota.name} allows "
                                    f"({', '.join(sorted(quota.pools))}; node label {self.book.names.pool_label})"))
        if tenant.controls is not None:
            layers.append(Layer(tenant.controls, "no GPU of this node is allowed by the pod's annotations "
                                                 "(pinned or avoided GPUs, wanted or avoided GPU models)"))
        if quotas and node is None:
            sizes = self.sizes.of(state)
            refused = refused_models(quotas, state.usage.of(tenant.namespace), request, sizes)
            everywhere = refused_everywhere(refused, sizes)
            if everywhere is not None:
                return Admission(request, everywhere)
            if refused:
                layers.append(Layer(CardScope("GPU models the quota leaves room on",
                                              avoid_models=frozenset(refused)), refused_text(refused)))
        scope: CardScope | None = None
        for layer in layers:
            scope = narrow(scope, layer.scope)
        return Admission(scoped(request, scope), None, tuple(layers), quotas, tenant.namespace, self.refusals)

    # ------------------------------------------------------------------------------ groups
    def _group_layer(self, state: ClusterState, request: PodRequest, tenant: PodTenancy, node: str | None,
                     layers: list[Layer]) -> str | None:
        """Append the group layer (or the reserved-cards layer); a reason refusing the pod, or None."""
        book, compiled = self.book, self.compiled(state)
        namespace = tenant.namespace
        wanted = (tenant.group,) if tenant.group else book.defaults.get(namespace, ())
        if not tenant.group and namespace in book.broken_defaults:
            return f"the pod names no resource group and its namespace's default cannot be read: " \
                   f"{book.broken_defaults[namespace]}"
        if not wanted:
            if compiled.outside is not None:
                layers.append(Layer(compiled.outside, "every GPU of this node is reserved by a resource group; "
                                                      f"name one in the pod label {book.names.group_label}"))
            return None
        candidates: list[Group] = []
        refusals: list[str] = []
        for name in wanted:
            group = book.groups.get(name)
            if name in book.broken_groups:
                refusals.append(f"ResourceGroup {name} cannot be read: {book.broken_groups[name]}")
            elif group is None:
                refusals.append(f"resource group {name} does not exist")
            elif not (group.admits(namespace, tenant.service_account) or self._creator_checked(group, tenant)):
                refusals.append(f"resource group {name} does not admit namespace {namespace} "
                                f"(ServiceAccount {tenant.service_account})" + self._creators_unchecked(group))
            else:
                candidates.append(compiled.groups[name])
        if node is not None and len(candidates) > 1:
            row = state.index.get(node)
            on_node = [g for g in candidates if row is not None and state.scope_reach(g.scope)[row]]
            candidates = on_node or candidates
        if not candidates:
            return "; ".join(refusals)
        choice = choose_group(state, scoped(request, tenant.controls), candidates)
        if choice.group is None:
            return "no resource group of the pod can hold it now: " + "; ".join(
                [*refusals, *(choice.refused[g.name] for g in candidates)])
        chosen = choice.group
        layers.append(Layer(chosen.scope, f"node is not in resource group {chosen.name} "
                                          "(no GPU of the group is on it)"))
        return None

    def compiled(self, state: ClusterState) -> _Compiled:
        """Every readable group as the core's :class:`Group`, its GPUs checked against the ledger."""
        key = (self.book.version, state.layout_version, id(state))
        if self._compiled is not None and self._compiled[0] == key:
            return self._compiled[1]
        groups: dict[str, Group] = {}
        problems: dict[str, str] = {}
        for group in self.book.groups.values():
            whole = frozenset(n.name for n in group.nodes if n.gpus is None)
            uuids: set[str] = set()
            for entry in group.nodes:
                if entry.gpus is None:
                    continue
                row = state.index.get(entry.name)
                present = {c.uuid for c in state.specs[row].cards} if row is not None and state.present[row] else set()
                uuids |= entry.gpus & present
                stray = sorted(entry.gpus - present)
                if stray:
                    problems[f"{group.name}/{entry.name}"] = (
                        f"ResourceGroup {group.name}: GPU(s) {', '.join(stray[:5])} are not on node {entry.name}"
                        + ("" if row is not None else " (the node is not known)") + "; left out of the group")
            groups[group.name] = Group(group.name, CardSet(whole, frozenset(uuids)), group.shared)
        for key_, problem in problems.items():
            if self.group_problems.get(key_) != problem:
                log.warning("%s", problem)
        self.group_problems = problems
        compiled = _Compiled(groups, outside_scope(list(groups.values())))
        self._compiled = (key, compiled)
        return compiled

    def _pool_scope(self, state: ClusterState, pools: frozenset[str]) -> CardScope:
        """The nodes whose pool label is one of ``pools`` (kept per node layout)."""
        key = (id(state), state.layout_version, pools)
        found = self._pools.get(key)
        if found is None:
            label = self.book.names.pool_label
            members = frozenset(spec.name for row, spec in enumerate(state.specs)
                                if state.present[row] and spec.labels.get(label) in pools)
            found = CardScope(f"pools {', '.join(sorted(pools))}", (CardSet(nodes=members),))
            self._pools = {k: v for k, v in self._pools.items() if k[:2] == key[:2]}
            self._pools[key] = found
        return found
