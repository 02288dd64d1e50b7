"""What a new GPU pod asks for, judged when it is created: sizes written where a resource counts
units are rewritten to the count (:mod:`gpupool.kube.memory_quantity`), and a pod gpupool can
never place is refused with the reason instead of waiting Pending for good.

"Never" is one of two things:

* the request cannot be read at all (:func:`gpupool.kube.translate.pod_request` refuses it: a
  compute share above 100 percent, a memory count of 1 TiB or more per card, a whole-card count
  beside a slice, ...): a property of the pod alone, refused whatever the cluster;
* no node the extender knows could hold it even with all its cards idle
  (:func:`gpupool.core.feasibility.shape_problem`: more memory than the largest card, more cards
  than any node has of the model and size asked, a model no node has). Judged only once the
  extender's cache has listed the nodes and some node has cards; a pod annotated
  ``<domain>/wait-for-nodes: "true"`` is let through, for nodes an autoscaler adds on demand.

The same sentences as the filter's, so the pod refused here would have been refused by every node
for the same reason. Pods that ask for none of gpupool's resources are never judged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any

from gpupool.api.names import ResourceNames
from gpupool.core.feasibility import shape_problem
from gpupool.core.model import PodRequest
from gpupool.extender.admission import ALLOWED, Verdict
from gpupool.extender.ledger_reads import ReadyLedger
from gpupool.kube.memory_quantity import size_rewrites, with_counts
from gpupool.kube.translate import TranslationError, pod_request, pod_wants_gpu

TRUE = "true"
MEMO_SIZE = 256
"""Verdicts of the cluster check kept per node layout: the pods of one Deployment or Job ask the
same, and the check walks every card of the cluster (about 2.5 ms at 5,000 nodes of 8 cards)."""


class RequestAdmission:
    """Judges what new pods ask for against the extender's ledger (its nodes' cards)."""

    def __init__(self, ledger: ReadyLedger | None, names: ResourceNames) -> None:
        self.ledger = ledger
        self.names = names
        self._memo: OrderedDict[Hashable, str | None] = OrderedDict()

    def review(self, pod: Mapping[str, Any], *, rewrite: bool = True) -> Verdict:
        """The verdict on creating ``pod``: refused with the reason, or allowed with the patch that
        writes counts for sizes and a warning per rewritten value. ``rewrite=False`` (a validating
        webhook, which sees the pod as it will be stored): a size is judged as the count it is."""
        if not pod_wants_gpu(pod, self.names):
            return ALLOWED
        rewrites = size_rewrites(pod, self.names) if rewrite else ()
        try:
            request = pod_request(with_counts(pod, rewrites), self.names)
        except TranslationError as exc:
            return Verdict(False, str(exc))
        problem = self.never_fits(request, pod)
        if problem is not None:
            return Verdict(False, problem)
        warnings = tuple(dict.fromkeys(r.warning() for r in rewrites))
        return Verdict(True, warnings=warnings, patch=tuple(r.patch() for r in rewrites))

    def never_fits(self, request: PodRequest, pod: Mapping[str, Any]) -> str | None:
        """Why no node of the cluster could ever hold ``request`` (module doc), or None."""
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if self.ledger is None or not request.wants_gpu or annotations.get(self.names.wait_for_nodes) == TRUE:
            return None
        ledger = self.ledger
        with ledger.lock:
            state = ledger.state
            if not ledger.synced or not state.capacity().has_cards:
                return None
            # the answer depends on the nodes' cards and the containers' requests only
            key = (id(state), state.layout_version,
                   tuple((c.name, c.gpu) for c in (*request.containers, *request.init_containers)))
            if key in self._memo:
                self._memo.move_to_end(key)
                problem = self._memo[key]
            else:
                problem = self._memo[key] = shape_problem(state, request)
                if len(self._memo) > MEMO_SIZE:
                    self._memo.popitem(last=False)
        if problem is None:
            return None
        return (f"pod {request.key} can never be placed on the nodes of this cluster: {problem}; if nodes with "
                f"such cards are coming (an autoscaler), annotate the pod {self.names.wait_for_nodes}: \"true\"")
