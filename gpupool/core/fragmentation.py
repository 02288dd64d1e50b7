"""GPU fragmentation against a workload, the measure behind FGD (Weng et al., ATC'23).

A card's leftover is a *fragment* for a class of pods when that class cannot use it: the card is too
small for one of the class's slices, the node lacks CPU for it, it has too few usable cards, or the
card's model is not allowed. A node's fragmentation is the expected fragment over the workload's
*typical pods* (the most common request shapes, weighted by how often they occur). Placing a pod
where it raises fragmentation least keeps leftovers useful for the pods that will come.

Everything is vectorised over ``[rows, cards, classes]`` so that the scheduler can evaluate every
card of every candidate node at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gpupool.core.model import GpuRequest, PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.core.units import COMPUTE_PER_CARD

FloatArray = npt.NDArray[np.float64]

INT16_CARDS = int(np.iinfo(np.int16).max) // COMPUTE_PER_CARD
"""Card columns up to which the per-card passes use int16: a node's summed free compute (at most
1000 per card) stays below its maximum, and so does a card's compute plus a class's size."""

DEFAULT_CPU_MILLI = 100
"""Kubernetes counts a zero CPU request as 100m when scoring; so does the fragmentation measure."""


@dataclass(frozen=True)
class TypicalPod:
    """One request shape of the workload and its share of all pods."""

    cpu_milli: int
    milli: int
    count: int
    models: frozenset[str]
    freq: float


def primary_gpu(pod: PodRequest) -> GpuRequest | None:
    """The GPU request that characterises a pod for scoring: its largest GPU container."""
    best: GpuRequest | None = None
    for container in pod.gpu_containers:
        request = container.gpu
        assert request is not None
        size = (request.count * (COMPUTE_PER_CARD if request.exclusive else request.compute))
        if best is None or size > best.count * (COMPUTE_PER_CARD if best.exclusive else best.compute):
            best = request
    return best


def shape_of(pod: PodRequest) -> tuple[int, int, int, frozenset[str]]:
    """(non-zero CPU, per-card milli, card count, models) — the key typical pods are grouped by."""
    cpu = pod.cpu_milli or DEFAULT_CPU_MILLI
    gpu = primary_gpu(pod)
    if gpu is None:
        return cpu, 0, 0, frozenset()
    milli = COMPUTE_PER_CARD if gpu.exclusive else gpu.compute
    return cpu, milli, gpu.count, gpu.models


@dataclass(frozen=True)
class WorkloadProfile:
    """The typical pods of a workload (FGD's target workload)."""

    pods: tuple[TypicalPod, ...]

    def gpu_pods(self) -> list[TypicalPod]:
        """The typical pods that ask for some GPU (CPU-only pods left out)."""
        return [p for p in self.pods if p.count > 0 and p.milli > 0]

    @staticmethod
    def from_pods(pods: Iterable[PodRequest], coverage: float = 0.95) -> WorkloadProfile:
        """The most frequent shapes covering ``coverage`` of the pods, frequencies renormalised.

        Shapes are ranked by count (ties by the shape itself, largest first, as the paper's
        simulator does) and the shortest prefix reaching ``coverage`` is kept.
        """
        counts = Counter(shape_of(p) for p in pods)
        if not counts:
            return WorkloadProfile(())
        total = sum(counts.values())

        def rank(item: tuple[tuple[int, int, int, frozenset[str]], int]) -> tuple[object, ...]:
            (cpu, milli, count, models), n = item
            return (n, cpu, milli, count, "|".join(sorted(models)))

        ordered = sorted(counts.items(), key=rank, reverse=True)
        kept: list[tuple[tuple[int, int, int, frozenset[str]], int]] = []
        covered = 0
        for item in ordered:
            kept.append(item)
            covered += item[1]
            if covered >= coverage * total:
                break
        return WorkloadProfile(tuple(
            TypicalPod(cpu_milli=cpu, milli=milli, count=count, models=models, freq=n / covered)
            for (cpu, milli, count, models), n in kept
        ))


class FragmentationMeasure:
    """Fragmentation of nodes, and of nodes after a hypothetical placement, against a profile."""

    def __init__(self, state: ClusterState, profile: WorkloadProfile) -> None:
        self.state = state
        self.profile = profile
        pods = profile.pods
        self.class_milli: IntArray = np.array([p.milli for p in pods], dtype=np.int64)
        self.class_count: IntArray = np.array([p.count for p in pods], dtype=np.int64)
        self.class_cpu: IntArray = np.array([p.cpu_milli for p in pods], dtype=np.int64)
        self.class_weight: FloatArray = np.array([p.freq for p in pods], dtype=np.float64)
        self.weight_total = float(self.class_weight.sum())
        self._gpu_class: BoolArray = self.class_count > 0
        # The per-card arrays are [rows, cards, classes] of compute (0..1000 per card) and sums over
        # a node's cards: the narrowest integer type that holds them exactly (see _narrow) cuts the
        # memory traffic of int64 by four, and the values, hence every score, are the same.
        self._milli_by_type: dict[type[np.signedinteger[Any]], npt.NDArray[np.signedinteger[Any]]] = {
            kind: self.class_milli.astype(kind) for kind in (np.int16, np.int32)}
        self._access_models = -1
        self._access: BoolArray = np.zeros((0, len(pods)), dtype=bool)

    def _access_table(self) -> BoolArray:
        """``[model id + 1, class]``: may this class use a card of this model (row 0: no card)."""
        if self._access_models != len(self.state.models):
            table = np.zeros((len(self.state.models) + 1, len(self.profile.pods)), dtype=bool)
            for k, pod in enumerate(self.profile.pods):
                for model_id, model in enumerate(self.state.models):
                    table[model_id + 1, k] = not pod.models or model in pod.models
            self._access, self._access_models = table, len(self.state.models)
        return self._access

    def _narrow(self, free: IntArray) -> tuple[type[np.signedinteger[Any]], npt.NDArray[np.signedinteger[Any]]]:
        """The integer type for the per-card passes over ``free`` (``[rows, cards]``), and the class
        sizes in it: int16 while a node's summed compute fits (32 cards), int32 beyond."""
        kind: type[np.signedinteger[Any]] = np.int16 if free.shape[-1] <= INT16_CARDS else np.int32
        return kind, self._milli_by_type[kind]

    # The hot paths below gather rows with ``take`` and reduce with ``np.add.reduce``: the same
    # values as ``a[rows]`` and ``a.sum(axis=1)``, without their dispatch through Python, which is
    # most of the cost on the one to a few dozen rows a decision usually re-scores.
    def card_free(self, rows: IntArray) -> IntArray:
        """Free compute per card of ``rows``; missing or unhealthy cards count as nothing free."""
        state = self.state
        usable = state.card_exists.take(rows, 0) & state.card_healthy.take(rows, 0)
        return np.where(usable, state.card_compute_free.take(rows, 0), 0)

    def _card_access(self, rows: IntArray) -> BoolArray:
        return self._access_table().take(self.state.card_model.take(rows, 0) + 1, 0)

    def fragment(self, free: IntArray, cpu_free: IntArray, access: BoolArray) -> FloatArray:
        """Fragmentation of nodes given their free compute per card ``[R, G]`` and CPU ``[R]``."""
        return self._fragment_at(cpu_free, *self._class_sums(free, access))

    def _class_sums(self, free: IntArray, access: BoolArray) -> tuple[FloatArray, IntArray, IntArray]:
        """Per node: its free compute (as float) and, per class, the free compute on the cards the
        class can use and how many such cards there are: all of the measure that looks at cards."""
        kind, class_milli = self._narrow(free)
        free_k = free.astype(kind)[..., None]
        usable = access & (free_k >= class_milli)
        used_free = np.add.reduce(usable * free_k, axis=1, dtype=kind)
        usable_count = np.add.reduce(usable, axis=1)
        return np.add.reduce(free, axis=1).astype(np.float64), used_free, usable_count

    def _fragment_at(self, cpu_free: IntArray, total: FloatArray, used_free: IntArray,
                     usable_count: IntArray) -> FloatArray:
        """The fragmentation of nodes with these :meth:`_class_sums` and ``cpu_free`` CPU."""
        satisfied = ((cpu_free[:, None] >= self.class_cpu) & (usable_count >= self.class_count)
                     & self._gpu_class)
        result: FloatArray = total * self.weight_total - np.where(satisfied, used_free, 0.0) @ self.class_weight
        return result

    def node_fragment(self, rows: IntArray, free: IntArray | None = None) -> FloatArray:
        """Current fragmentation of the nodes ``rows`` (``free``: their :meth:`card_free`, if known)."""
        if free is None:
            free = self.card_free(rows)
        return self.fragment(free, self.state.cpu_free.take(rows), self._card_access(rows))

    def fragment_of(self, rows: IntArray, free: IntArray, cpu_free: IntArray) -> FloatArray:
        """Fragmentation of the nodes ``rows`` had they ``free`` compute per card and ``cpu_free`` CPU
        (their cards' models as now): measures states recorded earlier, several in one pass."""
        return self.fragment(free, cpu_free, self._card_access(rows))

    def after_slice(self, rows: IntArray, milli: int, cpu: int) -> FloatArray:
        """``[R, G]``: fragmentation of each node if a ``milli`` slice (and ``cpu``) went to card g.

        Entries for cards that cannot take the slice are meaningless; the caller masks them.
        """
        return self.before_and_after_slice(rows, milli, cpu)[1]

    def before_and_after_slice(self, rows: IntArray, milli: int, cpu: int,
                               free: IntArray | None = None) -> tuple[FloatArray, FloatArray]:
        """The nodes' current fragmentation ``[R]`` and :meth:`after_slice` ``[R, G]`` in one pass.

        The "after" is computed incrementally from the node's current per-class usable sums, which
        the "before" needs anyway, so the cost is one pass over ``[R, G, classes]``. Every slice's
        score needs both; computing them apart would do the current sums twice per slice scored.
        ``free``: :meth:`card_free` of ``rows`` when the caller has it already.
        """
        if free is None:
            free = self.card_free(rows)
        access = self._card_access(rows)
        kind, class_milli = self._narrow(free)
        free_k = free.astype(kind)[..., None]
        usable = access & (free_k >= class_milli)
        used_free = np.add.reduce(usable * free_k, axis=1, dtype=kind)
        usable_count = np.add.reduce(usable, axis=1)
        cpu_free = self.state.cpu_free.take(rows)
        count_ok = usable_count >= self.class_count
        satisfied_now = (cpu_free[:, None] >= self.class_cpu) & self._gpu_class & count_ok
        total = np.add.reduce(free, axis=1).astype(np.float64)
        before: FloatArray = total * self.weight_total - np.where(satisfied_now, used_free, 0.0) @ self.class_weight
        # After a slice on card g, a class's usable sum loses all the card added if the card stops
        # being usable for it ("lost"), and the slice alone if it stays usable; its usable count
        # drops by one exactly where the card is lost. Written as masks and one masked subtraction:
        # np.where over broadcast operands cost several times more on these [R, G, classes] arrays.
        usable_after = usable & (free_k >= class_milli + milli)
        lost = usable ^ usable_after
        given = lost * free_k
        given += usable_after * kind(milli)
        cpu_ok = ((cpu_free - cpu)[:, None] >= self.class_cpu) & self._gpu_class
        keeps_count = (count_ok & cpu_ok)[:, None, :]
        spares_count = ((usable_count > self.class_count) & cpu_ok)[:, None, :]
        satisfied = (keeps_count & ~lost) | (spares_count & lost)
        used_after = np.subtract(used_free[:, None, :], given, dtype=np.float64, where=satisfied,
                                 out=np.zeros(given.shape))
        total_after = total - milli
        result: FloatArray = total_after[:, None] * self.weight_total - used_after @ self.class_weight
        return before, result

    def after_taking(self, rows: IntArray, taken: BoolArray, milli: int | None, cpu: int,
                     free: IntArray | None = None) -> FloatArray:
        """Fragmentation of each node after the cards marked in ``taken`` (``[R, G]``) give up
        ``milli`` each (``None``: the whole card) and the node gives up ``cpu``.

        ``free``: :meth:`card_free` of ``rows`` when the caller has it already (it is not changed).
        """
        return self.before_and_after_taking(rows, taken, milli, cpu, free, with_before=False)[1]

    def before_and_after_taking(self, rows: IntArray, taken: BoolArray | None, milli: int | None, cpu: int,
                                free: IntArray | None = None,
                                with_before: bool = True) -> tuple[FloatArray, FloatArray]:
        """The nodes' current fragmentation and :meth:`after_taking` (``taken`` None: no card is
        taken, only ``cpu``), sharing the lookups both need; ``with_before`` False leaves the first
        empty. Whole-card and multi-card pods are scored with both, one pass over the cards each; a
        CPU-only pod changes no card, so its "after" reuses the cards' pass of the "before".
        """
        if free is None:
            free = self.card_free(rows)
        access = self._card_access(rows)
        cpu_free = self.state.cpu_free.take(rows)
        if taken is None:
            sums = self._class_sums(free, access)
            before = self._fragment_at(cpu_free, *sums) if with_before else np.zeros(0)
            return before, self._fragment_at(cpu_free - cpu, *sums)
        before = self.fragment(free, cpu_free, access) if with_before else np.zeros(0)
        free = free.copy()
        if milli is None:
            free[taken] = 0
        else:
            free[taken] -= milli
        return before, self.fragment(free, cpu_free - cpu, access)

    def whole_cards_taken(self, rows: IntArray, count: int, free: IntArray) -> BoolArray:
        """``[R, G]``: the cards :meth:`after_whole` takes (the first ``count`` idle cards of each row).

        Which idle cards go does not change the measure (all are equally idle), so the first ones
        stand in.
        """
        idle = (self.state.card_mode.take(rows, 0) == 0) & (free > 0)
        taken: BoolArray = idle & (np.cumsum(idle, axis=1) <= count)
        return taken

    def after_whole(self, rows: IntArray, count: int, cpu: int, free: IntArray | None = None) -> FloatArray:
        """Fragmentation of each node after ``count`` whole idle cards (and ``cpu``) are taken.

        ``free``: as for :meth:`after_taking`.
        """
        if free is None:
            free = self.card_free(rows)
        return self.after_taking(rows, self.whole_cards_taken(rows, count, free), None, cpu, free)
