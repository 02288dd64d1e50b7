"""``gpupool simulate export``: a live cluster's nodes and pods as a trace the simulator replays.

The nodes and pods are read once (paged lists) with the caller's kubeconfig, translated by the same
code the extender uses (:mod:`gpupool.kube.translate`: inventories, gpupool's, HAMi's and gpushare's
resource names), and written in the openb CSV format (:mod:`gpupool.sim.trace_writer`), so ``gpupool
simulate --nodes nodes.csv --trace pods.csv`` asks how each policy would pack what runs today.
Pods the format cannot hold are left out and counted with their reason; nothing is written to the
cluster.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from gpupool.api.names import ResourceNames
from gpupool.core.model import NodeSpec
from gpupool.kube.translate import TranslationError, node_spec, pod_key, pod_request
from gpupool.sim.trace_writer import (
    NODE_COLUMNS,
    POD_COLUMNS,
    PodTimes,
    TraceShapeError,
    node_row,
    pod_row,
    trace_gpu,
    write_rows,
)

#: Phases of pods that hold nothing any more; left out unless asked for.
FINISHED = ("Succeeded", "Failed")
PAGE = 500


@dataclass
class Export:
    """The rows to write and what was left out, with the reason."""

    nodes: list[dict[str, str]] = field(default_factory=list)
    pods: list[dict[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    finished: int = 0

    @property
    def gpus(self) -> int:
        return sum(int(row["gpu"]) for row in self.nodes)

    @property
    def gpu_pods(self) -> int:
        return sum(1 for row in self.pods if row["num_gpu"] != "0")


def _seconds(stamp: Any) -> float | None:
    """An RFC 3339 timestamp of the API as seconds since the epoch (None when absent or unreadable)."""
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _scheduled_at(pod: Mapping[str, Any]) -> float | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return _seconds(condition.get("lastTransitionTime"))
    return None


def _usual_card_memory(nodes: Iterable[NodeSpec]) -> int:
    """The most common card memory of the cluster (0 without cards): what a pending pod's GPU
    memory is measured against."""
    counts = collections.Counter(card.memory_mib for node in nodes for card in node.cards)
    return counts.most_common(1)[0][0] if counts else 0


def build_export(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], names: ResourceNames, *,
                 include_finished: bool = False) -> Export:
    """Rows for ``nodes`` and ``pods`` (the API's JSON objects). Times are seconds since the earliest
    pod's creation; a pod's memory share is measured against the cards of its node, or the cluster's
    usual card while it waits."""
    export = Export()
    specs: dict[str, NodeSpec] = {}
    for raw in nodes:
        try:
            spec = node_spec(raw, names)
        except TranslationError as exc:
            export.skipped.append(f"node: {exc}")
            continue
        specs[spec.name] = spec
        export.nodes.append(node_row(spec))
        if len({card.model for card in spec.cards}) > 1:
            export.skipped.append(f"node {spec.name}: cards of several models, written as {spec.cards[0].model} "
                                  "(the format holds one model per node)")
    usual = _usual_card_memory(specs.values())
    kept: list[tuple[Mapping[str, Any], float]] = []
    for raw in pods:
        phase = str((raw.get("status") or {}).get("phase") or "Pending")
        if phase in FINISHED and not include_finished:
            export.finished += 1
            continue
        kept.append((raw, _seconds((raw.get("metadata") or {}).get("creationTimestamp")) or 0.0))
    start = min((created for _, created in kept), default=0.0)
    for raw, created in sorted(kept, key=lambda item: item[1]):
        try:
            request = pod_request(raw, names)
            node = specs.get(str((raw.get("spec") or {}).get("nodeName") or ""))
            card_mib = node.cards[0].memory_mib if node is not None and node.cards else usual
            gpu = trace_gpu(request, card_mib)
        except (TranslationError, TraceShapeError) as exc:
            where = _name(raw)
            export.skipped.append(f"pod {where}: {exc}")
            continue
        scheduled = _scheduled_at(raw)
        status = raw.get("status") or {}
        times = PodTimes(phase=str(status.get("phase") or "Pending"), qos=str(status.get("qosClass") or ""),
                         creation_time=round(created - start),
                         scheduled_time=None if scheduled is None else max(0, round(scheduled - start)))
        export.pods.append(pod_row(request, gpu, times))
    return export


def _name(raw: Mapping[str, Any]) -> str:
    try:
        return pod_key(raw)
    except TranslationError:
        return "(unnamed)"


def list_all(list_fn: Callable[..., Any]) -> list[dict[str, Any]]:
    """Every object of a paged list call, as the API's JSON."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": PAGE, "_preload_content": False}
        if token:
            kwargs["_continue"] = token
        page = json.loads(list_fn(**kwargs).data)
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items


@click.command("export")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, exists=True),
              help="The cluster to read (default: in-cluster, then ~/.kube/config).")
@click.option("--nodes-out", default="nodes.csv", show_default=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where the node list goes (simulate --nodes).")
@click.option("--pods-out", default="pods.csv", show_default=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where the pod list goes (simulate --trace).")
@click.option("-n", "--namespace", default=None, help="Only this namespace's pods (default: every namespace).")
@click.option("--include-finished", is_flag=True, help="Also pods that Succeeded or Failed.")
@click.option("--resource-domain", "domain", default="gpupool.io", show_default=True,
              help="gpupool's resource and annotation domain (the cluster's resourceDomain).")
@click.option("--hami", is_flag=True, help="Read nvidia.com/gpu as HAMi's (as the extender's --hami does).")
@click.option("--force", is_flag=True, help="Overwrite the output files if they exist.")
def export(kubeconfig: str | None, nodes_out: Path, pods_out: Path, namespace: str | None, include_finished: bool,
           domain: str, hami: bool, force: bool) -> None:
    """Write a live cluster's nodes and pods as a trace: `gpupool simulate --nodes NODES --trace PODS`."""
    for path in (nodes_out, pods_out):
        if path.exists() and not force:
            raise click.ClickException(f"{path} exists; add --force to overwrite it")
        if not path.resolve().parent.is_dir():
            raise click.ClickException(f"{path}: its directory does not exist")
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    from gpupool.kube.client_config import api_configuration

    try:
        core_v1 = client.CoreV1Api(client.ApiClient(api_configuration(kubeconfig)))
        nodes = list_all(core_v1.list_node)
        pods = list_all(core_v1.list_pod_for_all_namespaces if namespace is None else
                        lambda **kw: core_v1.list_namespaced_pod(namespace, **kw))
    except ConfigException as exc:
        raise click.ClickException(f"cannot load a kubeconfig: {exc}") from None
    except ApiException as exc:
        raise click.ClickException(f"the API server refused the list: {exc.status} {exc.reason}") from None
    except HTTPError as exc:
        raise click.ClickException(f"cannot reach the API server: {exc}") from None
    result = build_export(nodes, pods, ResourceNames(domain, hami=hami), include_finished=include_finished)
    if not result.nodes:
        raise click.ClickException("no node could be read: nothing written (the simulator needs nodes)")
    with nodes_out.open("w", newline="") as handle:
        write_rows(handle, NODE_COLUMNS, result.nodes)
    with pods_out.open("w", newline="") as handle:
        write_rows(handle, POD_COLUMNS, result.pods)
    click.echo(f"{nodes_out}: {len(result.nodes)} nodes, {result.gpus} GPUs")
    click.echo(f"{pods_out}: {len(result.pods)} pods, {result.gpu_pods} asking for GPUs"
               + (f" ({result.finished} finished pods left out)" if result.finished else ""))
    for line in result.skipped:
        click.echo(f"left out or changed: {line}", err=True)
    if result.pods and result.gpu_pods:
        click.echo(f"replay: gpupool simulate --nodes {nodes_out} --trace {pods_out} --policy gpupool --policy fgd")
    elif not result.pods:
        click.echo("no pods to replay: the simulator needs at least one", err=True)
