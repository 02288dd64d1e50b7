"""The over-grant backstop: a container's device memory as the driver reports it, against its grant.

Every isolation backend can be got past from inside the container (docs/isolation.md, "Known
bypasses": a static binary or raw ioctls never meet the interception library, a process can write
the library's account down), but none of that changes what the driver itself counts: NVML's
per-process used memory, by host pid. So the agent compares, per container and card, the sum of
that figure over the container's processes (the usage monitor's holders, so a process of another
container is never charged here) with the grant, on every node, whatever the backend.

Why a tolerance, and why per process: NVML's figure for a process includes what the driver keeps
for its context on the card (module code, local memory, the printf and malloc heaps: a few hundred
MiB per process, more with modules loaded eagerly), which no backend charges against the grant,
so a container using its grant in full shows more than the grant, by about that much for every
process holding memory on the card. :data:`DEFAULT_OVERHEAD_MIB` covers a context with CUDA's lazy
module loading (the default since CUDA 12.2); ``--risk-memory-tolerance`` raises it for workloads
that load large module sets eagerly.

The same figures tell a tampered account: where the library runs, the region of the container
(what the library enforces against) must show at least what the driver reports for the processes
that registered with the agent, less that overhead. Processes that did not register (they bypassed
the library) are left out of that comparison: they never charged the region, and they are the
``unregistered-process`` and ``over-memory`` risks instead.

Pure: the figures come in, a detail text (why it is a risk) or ``None`` goes out. A missing figure
is never a risk: a process NVML does not list (gone, or the driver hides its memory) counts 0, and
a sample older than :data:`MAX_SAMPLE_AGE_S` (NVML hung) is not judged at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpupool.nodeagent.monitor.usage_sampling import UsageSample

DEFAULT_OVERHEAD_MIB = 512
"""Driver memory per process holding memory on a card that no grant counts (module docstring)."""

MAX_SAMPLE_AGE_S = 10.0
"""An NVML sample older than this (the sampler takes one a second) is not judged: its processes may
have freed their memory or exited since."""


@dataclass(frozen=True)
class DriverFigures:
    """What the driver reports for some processes on one card: MiB in all, and how many hold any."""

    used_mib: int
    processes: int

    def allowed(self, grant_mib: int, overhead_mib: int) -> int:
        """The grant plus the driver's overhead for each of these processes."""
        return grant_mib + overhead_mib * self.processes


def memory_by_pid(sample: UsageSample | None, card: int, now: float) -> dict[int, int]:
    """pid → MiB NVML reports on ``card``; empty when the card was not sampled or the sample is stale."""
    if sample is None or now - sample.time > MAX_SAMPLE_AGE_S:
        return {}
    sampled = sample.card(card)
    return {p.pid: p.memory_used_mib for p in sampled.processes} if sampled is not None else {}


def driver_figures(memory: Mapping[int, int], pids: Iterable[int]) -> DriverFigures:
    """The driver's figures for these pids (each counted once; one NVML does not list counts 0)."""
    held = [memory.get(pid, 0) for pid in set(pids)]
    return DriverFigures(sum(held), sum(1 for mib in held if mib > 0))


def over_grant(driver: DriverFigures, grant_mib: int, overhead_mib: int, enforcing: bool) -> str | None:
    """Why the container is over its grant, or ``None`` while within it and the tolerance."""
    allowed = driver.allowed(grant_mib, overhead_mib)
    if driver.used_mib <= allowed:
        return None
    enforced = ("an isolation backend enforces the grant, so the container got past it" if enforcing
                else "no isolation backend enforces it")
    return (f"use {driver.used_mib} MiB, above the grant's {grant_mib} MiB (the driver's per-process figures; "
            f"{allowed} MiB allowed with {overhead_mib} MiB of driver overhead for each of {driver.processes} "
            f"processes); {enforced}")


def region_tampered(driver: DriverFigures, accounted_mib: int, overhead_mib: int) -> str | None:
    """Why the region's account is not the driver's, or ``None`` while it covers what the driver
    reports for the registered processes, less their overhead."""
    if driver.used_mib <= accounted_mib + overhead_mib * driver.processes:
        return None
    return (f"has {accounted_mib} MiB in its accounting region (memory.region) while the driver reports "
            f"{driver.used_mib} MiB for its {driver.processes} registered processes ({overhead_mib} MiB of "
            "driver overhead each allowed): the region's counters were written down from inside the "
            "container, so the interception library no longer holds it to its grant")
