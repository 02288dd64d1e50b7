"""Generated workload variants: the FGD paper's CPU-only-share traces, built from the default trace.

The paper (Weng et al., ATC'23, Fig. 14) evaluates workloads in which a given share of the pods are
CPU-only (``openb_pod_list_cpu050`` ... ``cpu250`` in Alibaba's trace release). Those files keep
every GPU pod of the default trace unchanged and replace its CPU-only pods by a sample of them: a
subsample below the default's own share (13.3 %), draws with replacement above it (the released
``cpu250`` holds 2,356 CPU-only pods drawn from the default's 1,088, some up to 8 times). Only
``cpu050`` ships with gpupool; the others are generated here by the same method, so any share can
be studied and the generated sample itself can be varied (its seed), which checks that a policy is
not tuned to one draw.

Names: ``cpuNNN`` (three digits) is NNN per mille of the pods CPU-only, the paper's naming
(``cpu250`` = 25.0 %), drawn with :data:`DEFAULT_VARIANT_SEED`; ``cpuNNN@S`` draws with seed
``S``. A bundled name (``cpu050``) always means the shipped file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.sim.trace import BUNDLED_TRACES, TraceError, TracePod, load_pods, resolve_trace

BASE_TRACE = "default"
"""The trace whose pods every CPU-share variant is drawn from, as in the paper."""

DEFAULT_VARIANT_SEED = 0
"""Seed of the draw for a variant named without ``@seed``: one fixed sample, like the paper's file."""

_CPU_VARIANT = re.compile(r"^cpu(?P<permille>\d{3})(?:@(?P<seed>\d+))?$")
PER_MILLE = 1000


@dataclass(frozen=True)
class CpuVariant:
    """A workload in which ``share`` of the pods are CPU-only, drawn with ``seed``."""

    share: float
    seed: int = DEFAULT_VARIANT_SEED

    @staticmethod
    def parse(name: str) -> CpuVariant | None:
        """The variant a trace name asks for, or None when the name is not ``cpuNNN[@S]``."""
        match = _CPU_VARIANT.match(name)
        if match is None:
            return None
        return CpuVariant(share=int(match["permille"]) / PER_MILLE, seed=int(match["seed"] or DEFAULT_VARIANT_SEED))


def is_cpu_only(pod: PodRequest) -> bool:
    """A pod that asks for no GPU at all."""
    return not pod.wants_gpu


def cpu_share_variant(pods: Sequence[TracePod], share: float, seed: int) -> list[TracePod]:
    """Every GPU pod of ``pods``, plus CPU-only pods drawn from its own so they make ``share`` of all.

    The number of CPU-only pods is ``ceil(gpu_pods * share / (1 - share))``. They are a sample
    without replacement when the base has that many, with replacement otherwise (the paper's files
    do the same on either side of the default's share). Drawn pods are renamed ``cpu-only-NNNNN``
    (a pod drawn twice must appear twice); GPU pods keep their names. The result depends only on
    ``pods``, ``share`` and ``seed``.
    """
    if not 0.0 <= share < 1.0:
        raise TraceError(f"CPU-only share must be in [0, 1), got {share}")
    gpu_pods = [p for p in pods if not is_cpu_only(p.request)]
    cpu_pods = sorted((p for p in pods if is_cpu_only(p.request)), key=lambda p: p.request.key)
    if not gpu_pods:
        raise TraceError("a CPU-share variant needs a base trace with GPU pods")
    wanted = math.ceil(len(gpu_pods) * share / (1.0 - share) - 1e-9)
    if wanted and not cpu_pods:
        raise TraceError("a CPU-share variant needs a base trace with CPU-only pods to draw from")
    rng = np.random.default_rng(seed)
    picks: list[int] = rng.choice(len(cpu_pods), size=wanted, replace=wanted > len(cpu_pods)).tolist() if wanted else []
    drawn = [
        replace(cpu_pods[k], request=replace(cpu_pods[k].request, key=f"cpu-only-{i:05d}"))
        for i, k in enumerate(picks)
    ]
    return drawn + gpu_pods


def load_trace(name_or_path: str) -> list[TracePod]:
    """The pods of a bundled trace, a generated variant (``cpu250``, ``cpu250@7``) or a CSV path."""
    if name_or_path not in BUNDLED_TRACES:
        variant = CpuVariant.parse(name_or_path)
        if variant is not None:
            return cpu_share_variant(load_pods(resolve_trace(BASE_TRACE)), variant.share, variant.seed)
    return load_pods(resolve_trace(name_or_path))
