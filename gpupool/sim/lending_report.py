"""The lending experiment: the same loaded workload replayed without and with lending, and its gain.

``gpu_hours_recovered_pct`` is the GPU-hours borrowers ran on lent GPUs, as a percentage of the
GPU-hours allocated in the run without lending: how much more GPU work the same cluster served.
``idle_harvested_pct`` is the same borrowed GPU-hours as a percentage of the GPU-hours owners lent
(their idle windows past the monitor's threshold): how much of what lending offered borrowers used.
The gain depends most on how idle the owners are, so the experiment repeats the lending run for a
range of idle shares (the table under the report); the workload's arrivals and shapes stay the same,
only the owners' idle windows change.

With ``remote_borrow`` the lending runs let borrowers use remote shares (docs/remote-gpu.md; see
:mod:`gpupool.sim.lending`) and one more run, lending without them, is the comparison. A remote
share's pod runs on a node without GPUs (the cluster's rule: a GPU node runs such a pod only on its
own cards), so ``cpu_nodes`` adds CPU-only nodes to the cluster replayed (the bundled node list has
GPU nodes only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from gpupool.core.model import NodeSpec
from gpupool.sim.arrivals import ArrivingPod, loaded_workload, sample_nodes
from gpupool.sim.idle_model import IdleModel
from gpupool.sim.lending import REMOTE_SLOWDOWN, ReplayOutcome, replay
from gpupool.sim.trace import TracePod

DEFAULT_LOAD = 2.0
"""Offered GPU demand as a multiple of the cluster's GPUs: lending matters only when pods wait."""

DEFAULT_HOURS = 168.0
"""A week of arrivals: long enough for the queue of a cluster offered twice its GPUs to settle."""
DEFAULT_NODES = 30
"""GPU nodes drawn from the trace's cluster: enough for every card shape, small enough to replay
three days of arrivals in seconds."""
DEFAULT_CPU_NODES = 16
"""Nodes without GPUs added for remote borrowers when none are given: about one for two GPU nodes;
more add nothing at the defaults (docs/lending.md: the harvest is 45.7 % with 4, 52.2 % with 16,
51.2-51.9 % with 30 or 64)."""

IDLE_SHARES = (0.1, 0.2, 0.3, 0.4, 0.5)
"""Idle shares of the gain table."""


@dataclass(frozen=True)
class LendingSetup:
    """Everything that defines one lending experiment."""

    policy: str
    load: float = DEFAULT_LOAD
    hours: float = DEFAULT_HOURS
    nodes: int = DEFAULT_NODES
    idle: IdleModel = field(default_factory=IdleModel)
    seed: int = 42
    remote_borrow: bool = False
    cpu_nodes: int = 0
    """CPU-only nodes added to the drawn GPU nodes, each with their median CPU and memory."""


@dataclass(frozen=True)
class GainRow:
    """The gain at one idle share."""

    idle_share: float
    gpu_hours_recovered_pct: float
    reclaims: int
    mean_wait_hours: float
    idle_harvested_pct: float = 0.0


@dataclass(frozen=True)
class LendingReport:
    setup: LendingSetup
    cluster_gpus: int
    without: ReplayOutcome
    with_lending: ReplayOutcome
    by_idle_share: tuple[GainRow, ...]
    local_only: ReplayOutcome | None = None  # with remote_borrow: lending without remote shares

    @property
    def gpu_hours_recovered_pct(self) -> float:
        return recovered_pct(self.without, self.with_lending)

    @property
    def idle_harvested_pct(self) -> float:
        return harvested_pct(self.with_lending)

    def to_json(self) -> dict[str, object]:
        idle = self.setup.idle
        return {
            "mode": "timeline", "lending": True, "policy": self.setup.policy,
            "gpu_hours_recovered_pct": self.gpu_hours_recovered_pct,
            "idle_harvested_pct": self.idle_harvested_pct,
            "resume_wait_hours_per_reclaim": resume_wait_per_reclaim(self.with_lending),
            "setup": {"load": self.setup.load, "hours": self.setup.hours, "nodes": self.setup.nodes,
                      "cluster_gpus": self.cluster_gpus, "seed": self.setup.seed, "idle_share": idle.idle_share,
                      "mean_idle_minutes": idle.mean_idle_minutes, "idle_threshold_minutes": idle.threshold_minutes},
            "without_lending": asdict(self.without),
            "with_lending": asdict(self.with_lending),
            "by_idle_share": [asdict(row) for row in self.by_idle_share],
            **({} if self.local_only is None else {
                "remote_borrow": True, "cpu_nodes": self.setup.cpu_nodes,
                "remote_slowdown": REMOTE_SLOWDOWN,
                "with_lending_local_only": asdict(self.local_only),
                "local_only_gpu_hours_recovered_pct": recovered_pct(self.without, self.local_only),
                "local_only_idle_harvested_pct": harvested_pct(self.local_only)}),
        }


def recovered_pct(without: ReplayOutcome, with_lending: ReplayOutcome) -> float:
    if without.allocated_gpu_hours <= 0:
        return 0.0
    return round(100.0 * with_lending.borrowed_gpu_hours / without.allocated_gpu_hours, 2)


def harvested_pct(with_lending: ReplayOutcome) -> float:
    """Borrowed GPU-hours as a percentage of the GPU-hours owners lent."""
    if with_lending.lent_gpu_hours <= 0:
        return 0.0
    return round(100.0 * with_lending.borrowed_gpu_hours / with_lending.lent_gpu_hours, 2)


def resume_wait_per_reclaim(with_lending: ReplayOutcome) -> float:
    """Mean hours a reclaimed borrower waited before it ran again: what a reclaim cost it (its progress
    is kept by the checkpoint protocol, so waiting is the loss the model sees)."""
    if with_lending.reclaims == 0:
        return 0.0
    return round(with_lending.resume_wait_hours / with_lending.reclaims, 3)


def run_lending(all_nodes: Sequence[NodeSpec], trace: Sequence[TracePod], setup: LendingSetup,
                idle_shares: Sequence[float] = IDLE_SHARES, jobs: int = 1) -> LendingReport:
    """Replay one loaded workload without lending, with it, and with it at each idle share of the table.

    The replays are independent; ``jobs`` > 1 runs them in that many processes.
    """
    nodes = sample_nodes(all_nodes, setup.nodes, np.random.default_rng(setup.seed))
    nodes += cpu_only_nodes(nodes, setup.cpu_nodes)
    shares = [setup.idle.idle_share, *(s for s in idle_shares if s != setup.idle.idle_share)]
    runs = [(nodes, trace, setup, None)] + [(nodes, trace, setup, share) for share in shares]
    if setup.remote_borrow:
        runs.append((nodes, trace, replace(setup, remote_borrow=False), setup.idle.idle_share))
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor  # only here: gpupool simulate starts faster

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            outcomes = list(pool.map(_run, runs))
    else:
        outcomes = [_run(run) for run in runs]
    without, with_lending = outcomes[0], outcomes[1]
    by_share = dict(zip(shares, outcomes[1:len(shares) + 1], strict=True))
    rows = tuple(GainRow(share, recovered_pct(without, by_share[share]), by_share[share].reclaims,
                         by_share[share].mean_wait_hours, harvested_pct(by_share[share])) for share in idle_shares)
    local_only = outcomes[-1] if setup.remote_borrow else None
    return LendingReport(setup, sum(len(n.cards) for n in nodes), without, with_lending, rows, local_only)


def cpu_only_nodes(gpu_nodes: Sequence[NodeSpec], count: int) -> list[NodeSpec]:
    """``count`` nodes without GPUs, each with the median CPU and memory of ``gpu_nodes``: where a
    remote share's pod may run (the bundled trace's node list holds GPU nodes only)."""
    if count <= 0 or not gpu_nodes:
        return []
    cpu = int(np.median([n.cpu_milli for n in gpu_nodes]))
    memory = int(np.median([n.memory_mib for n in gpu_nodes]))
    return [NodeSpec(name=f"cpu-only-{i:03d}", cpu_milli=cpu, memory_mib=memory) for i in range(count)]


def _run(run: tuple[Sequence[NodeSpec], Sequence[TracePod], LendingSetup, float | None]) -> ReplayOutcome:
    """One replay: without lending (share None) or with lending at an idle share."""
    nodes, trace, setup, share = run
    idle = setup.idle if share is None else replace(setup.idle, idle_share=share)
    pods = _workload(nodes, trace, setup, idle)
    lending = share is not None
    return replay(nodes, pods, setup.policy, lending=lending, hours=setup.hours, seed=setup.seed,
                  remote_borrow=lending and setup.remote_borrow)


def _workload(nodes: Sequence[NodeSpec], trace: Sequence[TracePod], setup: LendingSetup,
              idle: IdleModel) -> list[ArrivingPod]:
    """The same arrivals and shapes for every idle model (one seed), so rows differ only in idleness."""
    return loaded_workload(trace, nodes, load=setup.load, hours=setup.hours, idle=idle,
                           rng=np.random.default_rng(setup.seed))


def text_report(report: LendingReport) -> list[str]:
    """The lines ``gpupool simulate --mode timeline --lending`` prints."""
    s, idle = report.setup, report.setup.idle
    lines = [
        f"lending replay: {s.nodes} GPU nodes ({report.cluster_gpus} GPUs) of the trace's cluster, "
        f"{s.hours:g} h of arrivals offering {s.load:g}x its GPUs, policy {s.policy}, seed {s.seed}",
        f"idle model: {idle.idle_share:.0%} of a pod's time idle, idle periods {idle.mean_idle_minutes:g} min on "
        f"average, lendable after {idle.threshold_minutes:g} min without SM activity (docs/lending.md)",
        "",
        f"{'':<26}{'without':>12}{'with lending':>14}",
    ]
    rows = [
        ("pods arrived", report.without.pods, report.with_lending.pods, "{:d}"),
        ("pods finished", report.without.finished, report.with_lending.finished, "{:d}"),
        ("still waiting at the end", report.without.still_waiting, report.with_lending.still_waiting, "{:d}"),
        ("GPU-hours allocated", report.without.allocated_gpu_hours, report.with_lending.allocated_gpu_hours,
         "{:.0f}"),
        ("GPU-hours borrowed", report.without.borrowed_gpu_hours, report.with_lending.borrowed_gpu_hours, "{:.0f}"),
        ("mean wait (h)", report.without.mean_wait_hours, report.with_lending.mean_wait_hours, "{:.2f}"),
        ("p95 wait (h)", report.without.p95_wait_hours, report.with_lending.p95_wait_hours, "{:.2f}"),
        ("GPU-hours lent by owners", "-", f"{report.with_lending.lent_gpu_hours:.0f}", "{}"),
        ("lends / reclaims", "-", f"{report.with_lending.lends} / {report.with_lending.reclaims}", "{}"),
        ("wait after a reclaim (h)", "-", f"{resume_wait_per_reclaim(report.with_lending):.2f}", "{}"),
    ]
    for label, before, after, fmt in rows:
        lines.append(f"{label:<26}{fmt.format(before):>12}{fmt.format(after):>14}")
    lines += ["", f"gpu_hours_recovered_pct: {report.gpu_hours_recovered_pct:.2f} % "
                  "(GPU-hours served to borrowers / GPU-hours allocated without lending)",
              f"idle_harvested_pct: {report.idle_harvested_pct:.2f} % "
              "(GPU-hours served to borrowers / GPU-hours owners lent)", "",
              f"{'idle share':>10}{'recovered %':>13}{'harvested %':>13}{'reclaims':>10}{'mean wait (h)':>15}"]
    for row in report.by_idle_share:
        lines.append(f"{row.idle_share:>10.0%}{row.gpu_hours_recovered_pct:>13.2f}{row.idle_harvested_pct:>13.2f}"
                     f"{row.reclaims:>10}{row.mean_wait_hours:>15.2f}")
    if report.local_only is not None:
        remote, local = report.with_lending, report.local_only
        lines += ["", f"remote borrowing ({s.cpu_nodes} nodes without GPUs added; a remote borrower's work runs "
                      f"{REMOTE_SLOWDOWN:.0%} slower):",
                  f"{'':<26}{'local only':>12}{'with remote':>14}",
                  f"{'idle_harvested_pct':<26}{harvested_pct(local):>12.2f}{harvested_pct(remote):>14.2f}",
                  f"{'gpu_hours_recovered_pct':<26}{recovered_pct(report.without, local):>12.2f}"
                  f"{recovered_pct(report.without, remote):>14.2f}",
                  f"{'GPU-hours borrowed':<26}{local.borrowed_gpu_hours:>12.0f}{remote.borrowed_gpu_hours:>14.0f}",
                  f"{'mean wait (h)':<26}{local.mean_wait_hours:>12.2f}{remote.mean_wait_hours:>14.2f}",
                  f"{'remote starts / pods':<26}{'-':>12}{f'{remote.remote_starts} / {remote.remote_borrowers}':>14}",
                  f"{'GPU-hours held remotely':<26}{'-':>12}{remote.remote_gpu_hours:>14.0f}"]
    return lines
