"""Does the cluster decide what the simulator decides? One trace replayed through both.

The same scaled-down packing experiment (``--nodes`` nodes sampled from the bundled openb cluster
with ``--seed``, the seed's arrivals of :func:`gpupool.sim.packing.workload` up to ``--upto`` % of
the sample's GPU capacity) is replayed twice:

* **simulator**: :class:`gpupool.core.scheduler.Scheduler` books each pod, as ``gpupool simulate``
  does (node order for equal scores: the seed's permutation, :func:`gpupool.sim.packing.tie_order`);
* **extender**: every trace pod becomes a Kubernetes pod in the in-process :class:`FakePodApi`, and
  a stand-in for kube-scheduler v1.37 with only the extender scoring schedules it: its
  NodeResourcesFit filter (CPU and memory requested by the pods bound on each node), then the
  extender's HTTP ``/filter``, ``/prioritize`` and ``/bind`` (aiohttp app of
  :class:`gpupool.extender.http.api.ExtenderApi`, binder writing to the fake API, the API's pod
  events fed to the extender's cache). The node is the best-scored one; kube-scheduler breaks
  ties uniformly at random (a random key per node, ``framework.NewSortedScoredNodes``), and this
  stand-in takes the first tied node in the simulator's tie order: one particular random draw, the
  one the simulator made.

Pods without GPUs never reach the extender in a cluster (``managedResources``: kube-scheduler asks
it only about pods that request a gpupool resource); kube-scheduler's own plugins place them. This
bench binds them itself, through the fake API, on the node the simulator's policy picks from the
pods actually bound (the "bound" ledger below), so both replays place them by the same rule and a
difference in them can only come from an earlier GPU pod's difference.

With ``--extender-weight W`` the stand-in also runs the two score plugins of kube-scheduler v1.37's
default profile that tell this bench's nodes apart, NodeResourcesFit (strategy LeastAllocated, over
the non-zero CPU and memory requests) and NodeResourcesBalancedAllocation (the balance of CPU and
memory with the pod against without it, over the actual requests), weight 1 each, 0..100 (formulas
in :mod:`bench.fidelity_kube`), and adds ``W x 10 x`` the extender's 0..10 score, as kube-scheduler
does. The other default score plugins (TaintToleration, NodeAffinity, PodTopologySpread,
InterPodAffinity, ImageLocality, DynamicResources) give every node here the same score: the trace
pods have no images, affinities, tolerations, owners or resource claims, and the nodes no taints.

With ``--filter-best-only`` the extender runs so and the stand-in has no ``prioritizeVerb``
(the shipped ``deploy/scheduler-config-*.yaml``): it chooses among the nodes filter passed, by the
resource plugins when ``--extender-weight`` adds them (the weight itself is then unused), else the
first in the tie order. ``--filter-one-best`` (implies ``--filter-best-only``) runs the extender's
``--filter-one-best`` with the simulator's tie order as its node order: filter passes one node, so
kube-scheduler (and the resource plugins, when added) has nothing left to choose.

The *bound* ledger is the truth of the extender replay: every pod the API shows bound, with the
cards of its assignment and its CPU and memory. At the end it is compared with the extender's own
ledger: ``ledger_mismatch_nodes`` counts nodes whose free CPU, memory or card space differ.

    python3 bench/fidelity.py --nodes 150 --seed 42 --json
    python3 bench/fidelity.py --nodes 150 --seed 42 --filter-best-only --json
    python3 bench/fidelity.py --nodes 150 --seed 42 --filter-best-only --filter-one-best --json  # shipped
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fidelity_kube import replay_extender
from bench.fidelity_scenario import Outcome, Replay, Scenario, build_scenario, pod_object, replay_simulator

__all__ = ["build_scenario", "compare", "pod_object", "replay_extender", "replay_simulator"]


def compare(scenario: Scenario, simulator: Replay, extender: Replay) -> dict[str, Any]:
    keys = [pod.key for pod in scenario.arrivals]
    gpu_keys = [pod.key for pod in scenario.arrivals if pod.wants_gpu]
    same = [k for k in keys if simulator.outcomes[k] == extender.outcomes[k]]
    same_gpu = [k for k in gpu_keys if simulator.outcomes[k] == extender.outcomes[k]]
    first = next((k for k in keys if simulator.outcomes[k] != extender.outcomes[k]), None)
    mismatch_note = next((n for n in extender.notes if n.startswith("ledger_mismatch_nodes=")), "=0")
    return {
        "nodes": len(scenario.nodes), "pods": len(keys), "gpu_pods": len(gpu_keys),
        "seed": scenario.seed, "policy": scenario.policy,
        "same_placement_pct": round(100.0 * len(same) / max(len(keys), 1), 2),
        "same_placement_gpu_pct": round(100.0 * len(same_gpu) / max(len(gpu_keys), 1), 2),
        "unallocated_pct_extender": extender.unallocated_pct,
        "unallocated_pct_simulator": simulator.unallocated_pct,
        "first_divergence": None if first is None else {
            "pod": first, "position": keys.index(first),
            "simulator": _describe(simulator.outcomes[first]), "extender": _describe(extender.outcomes[first])},
        "bind_refusals": sum(1 for n in extender.notes if "bind to" in n),
        "ledger_mismatch_nodes": int(mismatch_note.split("=")[1]),
        "seconds_extender": round(extender.seconds, 2), "seconds_simulator": round(simulator.seconds, 2),
    }


def _describe(outcome: Outcome) -> str:
    if outcome.node is None:
        return "unplaced"
    cards = "; ".join(f"{name}: {list(cards)}" for name, cards in outcome.cards)
    return f"{outcome.node} {cards}".strip()


def table(result: dict[str, Any]) -> str:
    rows = [("nodes / pods (with GPU)", f"{result['nodes']} / {result['pods']} ({result['gpu_pods']})"),
            ("same placement, all pods", f"{result['same_placement_pct']:.2f} %"),
            ("same placement, GPU pods", f"{result['same_placement_gpu_pct']:.2f} %"),
            ("unallocated GPU, extender", f"{result['unallocated_pct_extender']:.2f} %"),
            ("unallocated GPU, simulator", f"{result['unallocated_pct_simulator']:.2f} %"),
            ("binds refused", str(result["bind_refusals"])),
            ("nodes where the ledgers differ", str(result["ledger_mismatch_nodes"])),
            ("first divergence", json.dumps(result["first_divergence"]))]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=150)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trace", default="default")
    parser.add_argument("--policy", default="gpupool")
    parser.add_argument("--upto", type=int, default=100, help="arrived GPU demand, %% of capacity")
    parser.add_argument("--extender-weight", type=int, default=None,
                        help="add kube-scheduler's resource score plugins, the extender weighted so")
    parser.add_argument("--filter-best-only", action="store_true",
                        help="the extender's --filter-best-only, kube-scheduler without prioritizeVerb")
    parser.add_argument("--filter-one-best", action="store_true",
                        help="with it, the extender's --filter-one-best in the simulator's tie order")
    parser.add_argument("--json", action="store_true", help="print one JSON line after the table")
    args = parser.parse_args(argv)
    scenario = build_scenario(args.trace, args.nodes, args.seed, args.upto, args.policy)
    simulator = replay_simulator(scenario)
    best_only = args.filter_best_only or args.filter_one_best
    extender = replay_extender(scenario, args.extender_weight, best_only, args.filter_one_best)
    result = compare(scenario, simulator, extender)
    result["extender_weight"] = args.extender_weight
    result["filter_best_only"] = best_only
    result["filter_one_best"] = args.filter_one_best
    print(table(result))
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
