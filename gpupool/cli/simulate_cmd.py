"""``gpupool simulate``: replay a trace through the same scheduling code the extender runs.

What only some modes need (tenants, the timeline, worker processes) is imported when used: a
one-seed replay takes a few seconds, and those imports were a noticeable part of its start.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from gpupool.cli.main import LazyGroup
from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import NodeSpec, PodRequest
from gpupool.core.policies import DEFAULT_POLICY, POLICIES
from gpupool.sim.idle_model import DEFAULT_IDLE_SHARE, IdleModel
from gpupool.sim.lending_report import (
    DEFAULT_CPU_NODES,
    DEFAULT_HOURS,
    DEFAULT_LOAD,
    DEFAULT_NODES,
    LendingSetup,
    run_lending,
    text_report,
)
from gpupool.sim.packing import SeedResult, run_seed
from gpupool.sim.published import context_lines
from gpupool.sim.report import PlottingUnavailable, PolicyReport, plot, require_plotting, text_table
from gpupool.sim.trace import TraceError, TracePod, load_nodes, resolve_nodes
from gpupool.sim.variants import load_trace

#: ``gpupool simulate`` sub-commands, loaded when used: export needs the Kubernetes client, a replay never.
SIMULATE_SUBCOMMANDS = {"export": "gpupool.cli.simulate_export:export"}


def parse_seeds(text: str) -> list[int]:
    """``"42-51"``, ``"42,45"`` or ``"42"`` into a list of seeds."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                if high < low:
                    raise ValueError
                seeds.extend(range(low, high + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise click.BadParameter(f"{text!r}: use a seed, a list (42,43) or a range (42-51)") from None
    if not seeds:
        raise click.BadParameter("no seeds given")
    return seeds


def _job(args: tuple[list[NodeSpec], list[PodRequest], str, int, WorkloadProfile]) -> SeedResult:
    nodes, pods, policy, seed, profile = args
    return run_seed(nodes, pods, policy, seed, profile)


@click.group("simulate", cls=LazyGroup, lazy=SIMULATE_SUBCOMMANDS, invoke_without_command=True,
             subcommand_metavar="[export ...]")
@click.option("--trace", "trace", default="default", show_default=True,
              help="Pod list: a bundled name (default, gpushare40, multigpu20, gpuspec10, cpu050), a generated "
                   "CPU-share variant (cpu250: 25.0 % of pods CPU-only, cpu250@7: another draw) or a CSV path.")
@click.option("--nodes", "nodes_name", default="openb", show_default=True,
              help="Node list: the bundled 'openb' cluster or a CSV path.")
@click.option("--policy", "policies", multiple=True, type=click.Choice(sorted(POLICIES)),
              help=f"Placement policy; repeat to compare. [default: {DEFAULT_POLICY}]")
@click.option("--seeds", default="42-51", show_default=True, help="Seeds: 42, 42,43 or 42-51.")
@click.option("--mode", type=click.Choice(["packing", "timeline"]), default="packing", show_default=True,
              help="packing: the FGD paper's fill-to-130% experiment; timeline: arrivals and departures in time.")
@click.option("--lending", is_flag=True,
              help="With --mode timeline: replay a loaded cluster without and with idle-GPU lending (docs/lending.md).")
@click.option("--load", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_LOAD, show_default=True,
              help="--lending: offered GPU demand as a multiple of the cluster's GPUs.")
@click.option("--hours", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_HOURS, show_default=True,
              help="--lending: hours of arrivals replayed.")
@click.option("--lending-nodes", type=click.IntRange(min=1), default=DEFAULT_NODES, show_default=True,
              help="--lending: GPU nodes drawn from the cluster.")
@click.option("--idle-share", type=click.FloatRange(min=0, max=1, max_open=True), default=DEFAULT_IDLE_SHARE,
              show_default=True, help="--lending: share of a GPU pod's running time spent idle.")
@click.option("--remote-borrow", is_flag=True,
              help="--lending: borrowers may also run on a node without GPUs with their slice on a lent card of "
                   "another node (remote GPUs); compared with lending without them (docs/lending.md).")
@click.option("--cpu-nodes", type=click.IntRange(min=0), default=None,
              help=f"--remote-borrow: nodes without GPUs added to the cluster, each with the GPU nodes' median CPU "
                   f"and memory [default: {DEFAULT_CPU_NODES}].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a PNG of the curves where the policies differ (needs matplotlib).")
@click.option("--jobs", type=int, default=0, help="Worker processes (default: one per CPU).")
@click.option("--tenants", type=click.Choice(["none", "qos"]), default="none", show_default=True,
              help="qos: replay in time with the trace's QoS classes as tenants and report per tenant.")
@click.option("--quotas", "quotas_path", type=click.Path(dir_okay=False, exists=True),
              help="YAML: tenant -> GpuQuota spec (with --tenants qos; docs/tenancy.md).")
@click.pass_context
def simulate(ctx: click.Context, trace: str, nodes_name: str, policies: tuple[str, ...], seeds: str, mode: str,
             lending: bool, load: float, hours: float, lending_nodes: int, idle_share: float, remote_borrow: bool,
             cpu_nodes: int | None, as_json: bool,
             plot_path: str | None, jobs: int, tenants: str, quotas_path: str | None) -> None:
    """Replay a trace on a cluster and report how well the policy packs GPUs.

    `gpupool simulate export` writes a live cluster's nodes and pods as a trace to replay here."""
    if ctx.invoked_subcommand is not None:
        given = [param.opts[0] for param in ctx.command.params if param.name is not None
                 and ctx.get_parameter_source(param.name) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"the replay's options ({', '.join(given)}) do not apply to "
                                   f"`gpupool simulate {ctx.invoked_subcommand}`: give its own options after its name")
        return
    chosen = list(policies) or [DEFAULT_POLICY]
    if plot_path:
        if mode != "packing" or lending or tenants != "none":
            raise click.UsageError("--plot draws the packing experiment's curves: use it without --mode timeline, "
                                   "--lending and --tenants")
        if not Path(plot_path).resolve().parent.is_dir():
            raise click.BadParameter(f"{plot_path}: its directory does not exist", param_hint="--plot")
        try:
            require_plotting()  # before the replay: a missing matplotlib must not cost a run's work
        except PlottingUnavailable as error:
            raise click.ClickException(str(error)) from error
    try:
        nodes = load_nodes(resolve_nodes(nodes_name))
        trace_pods = load_trace(trace)
    except (TraceError, OSError) as error:
        raise click.ClickException(str(error)) from error
    if tenants == "qos":
        from gpupool.cli.simulate_tenants import report_tenants

        report_tenants(nodes, trace_pods, chosen, quotas_path, as_json)
        return
    if quotas_path:
        raise click.BadParameter("--quotas needs --tenants qos")
    if (remote_borrow or cpu_nodes is not None) and not lending:
        raise click.UsageError("--remote-borrow and --cpu-nodes belong to the lending replay: "
                               "add --mode timeline --lending")
    if cpu_nodes is not None and not remote_borrow:
        raise click.UsageError("--cpu-nodes adds nodes for remote borrowers: add --remote-borrow")
    if lending:
        if mode != "timeline":
            raise click.UsageError("--lending replays arrivals in time: add --mode timeline")
        setup = LendingSetup(chosen[0], load, hours, lending_nodes, IdleModel(idle_share=idle_share),
                             parse_seeds(seeds)[0], remote_borrow=remote_borrow,
                             cpu_nodes=(DEFAULT_CPU_NODES if cpu_nodes is None else cpu_nodes) if remote_borrow else 0)
        report = run_lending(nodes, trace_pods, setup, jobs=jobs or (os.cpu_count() or 1))
        click.echo(json.dumps(report.to_json()) if as_json else "\n".join(text_report(report)))
        return
    if mode == "timeline":
        _timeline(nodes, trace_pods, chosen, as_json)
        return
    seed_list = parse_seeds(seeds)
    pods = [p.request for p in trace_pods]
    profile = WorkloadProfile.from_pods(pods)
    tasks = [(nodes, pods, policy, seed, profile) for policy in chosen for seed in seed_list]
    workers = jobs or min(len(tasks), os.cpu_count() or 1)
    results: list[SeedResult] = []
    with _progress(len(tasks)) as done:
        if workers <= 1:
            for task in tasks:
                results.append(_job(task))
                done()
        else:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(max_workers=workers) as pool:
                for result in pool.map(_job, tasks):
                    results.append(result)
                    done()
    reports = [
        PolicyReport(policy, trace, tuple(results[i * len(seed_list):(i + 1) * len(seed_list)]))
        for i, policy in enumerate(chosen)
    ]
    if plot_path:
        plot(reports, plot_path)
    if as_json:
        payload = reports[0].to_json() if len(reports) == 1 else {"policies": [r.to_json() for r in reports]}
        click.echo(json.dumps(payload))
        return
    click.echo(text_table(reports))
    for line in context_lines(trace, sum(len(node.cards) for node in nodes)):
        click.echo(line)
    if plot_path:
        click.echo(f"plot written to {Path(plot_path).resolve()}")


@contextlib.contextmanager
def _progress(runs: int) -> Iterator[Callable[[], None]]:
    """A progress bar on a terminal's stderr, called once per finished run; none for a single run,
    whose bar would only jump from 0 to 1 (and whose start would pay for importing tqdm)."""
    if runs <= 1:
        yield lambda: None
        return
    from tqdm import tqdm

    with tqdm(total=runs, desc="simulating", unit="run", file=sys.stderr, disable=None) as bar:

        def advance() -> None:
            bar.update(1)

        yield advance


def _timeline(nodes: list[NodeSpec], pods: list[TracePod], policies: list[str], as_json: bool) -> None:
    from gpupool.sim.timeline import replay_timeline

    results = [replay_timeline(nodes, pods, policy) for policy in policies]
    if as_json:
        click.echo(json.dumps({"mode": "timeline", "policies": [
            {"policy": r.policy, "refused_pods": r.refused_pods, "peak_allocated_gpu_pct": r.peak_allocated_gpu_pct,
             "mean_allocated_gpu_pct": r.mean_allocated_gpu_pct,
             "points": [[p.time, p.allocated_gpu_pct, p.running_pods, p.refused_pods] for p in r.points]}
            for r in results]}))
        return
    for r in results:
        click.echo(f"policy {r.policy}: refused {r.refused_pods} pods, GPU allocation mean "
                   f"{r.mean_allocated_gpu_pct:.2f}%, peak {r.peak_allocated_gpu_pct:.2f}%")
        click.echo(f"{'hour':>8}{'alloc %':>10}{'running':>9}{'refused':>9}")
        click.echo("  hour: the trace's clock (creation_time / 3600); alloc %: GPUs allocated, in % of the cluster's; "
                   "running: pods placed and not yet gone; refused: pods refused so far (no node had room)")
        stride = max(1, len(r.points) // 20)
        for p in r.points[::stride]:
            click.echo(f"{p.time / 3600:>8.1f}{p.allocated_gpu_pct:>10.2f}{p.running_pods:>9}{p.refused_pods:>9}")
