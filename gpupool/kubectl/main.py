"""The ``kubectl-gpupool`` command: ``kubectl gpupool inspect [NODE]`` and ``kubectl gpupool why POD``.

kubectl runs any executable named ``kubectl-<name>`` on ``PATH`` for ``kubectl <name>``, passing
every argument after the name; the console script installed with the package is that executable
(``python -m gpupool.kubectl`` is the same command). Connection flags follow kubectl's names and
are accepted after the sub-command, where kubectl leaves them to a plugin.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from gpupool.api.agent_lease import label_selector
from gpupool.api.cluster_settings import CONFIG_MAP, ClusterSettings, Setting
from gpupool.api.lending import LendingNames
from gpupool.api.tenancy import API_VERSION, TenancyNames
from gpupool.core.model import PodRequest
from gpupool.core.policies import POLICIES
from gpupool.core.state import ClusterState
from gpupool.kube.tenancy import PodTenancy, pod_tenancy
from gpupool.kube.tenancy_book import TenancyBook
from gpupool.kube.translate import TranslationError, foreign_resources, pod_key, pod_request
from gpupool.kubectl import connection as kube
from gpupool.kubectl.agent_usage import AGENT_TIMEOUT_S, DEFAULT_AGENT_PORT, AgentUsage
from gpupool.kubectl.cluster_settings import PluginSettings, read_settings, with_settings_problems
from gpupool.kubectl.inspect import inspect_json, inspect_table, node_views
from gpupool.kubectl.rules import ClusterRules, lease_refusals, loan_notes, tenancy_book
from gpupool.kubectl.snapshot import build_snapshot
from gpupool.kubectl.usage import NoUsage, UsageSource
from gpupool.kubectl.why import BEST_NODES, explain, why_json, why_text

EXAMPLES_PER_REASON = 3
"""Nodes ``why`` names under each reason unless told otherwise."""

F = TypeVar("F", bound=Callable[..., Any])


def connection_options(command: F) -> F:
    """kubectl's connection flags and where gpupool's shared settings are, on every sub-command."""
    for option in reversed((
        click.option("--kubeconfig", default=None, help="Path of the kubeconfig (default: "
                     "KUBECONFIG, else ~/.kube/config)."),
        click.option("--context", default=None, help="The kubeconfig context to use (default: its current one)."),
        click.option("--cluster-config", default=CONFIG_MAP, show_default=True, metavar="NAMESPACE/NAME",
                     help="The ConfigMap of the settings gpupool's components share (resource domain, gpushare "
                          "unit, HAMi, priority threshold, the agents' Lease namespace, the extender's policy, "
                          "requireAgentLease and unconfirmedTimeout; docs/cluster-config.md); \"\": none, the "
                          "built-in defaults."),
        click.option("--resource-domain", default=None,
                     help="gpupool's resource and annotation domain [default: the ConfigMap's, else "
                          f"{ClusterSettings().resource_domain}]."),
        click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True),
    )):
        command = option(command)
    return command


def _claims(connection: kube.Connection) -> list[dict[str, Any]]:
    """The cluster's ResourceClaims, booked beside the pods (DRA claims of gpupool's driver hold
    cards too); a user who may not list them is told, and the answer leaves them out."""
    try:
        return kube.list_claims(connection)
    except kube.ClusterAccessError as exc:
        click.echo(f"note: DRA claims not read ({exc}); cards they hold show as free", err=True)
        return []


def _connect(kubeconfig: str | None, context: str | None) -> kube.Connection:
    try:
        return kube.connect(kubeconfig, context)
    except kube.ClusterAccessError as exc:
        raise click.ClickException(str(exc)) from None


def _settings(connection: kube.Connection, cluster_config: str, resource_domain: str | None) -> PluginSettings:
    """The shared settings pods are read with; why the defaults, on stderr, when they are."""
    read = read_settings(connection, cluster_config, resource_domain)
    if read.note:
        click.echo(f"note: {read.note}", err=True)
    return read


def _emit(output: str, text: Callable[[], str], doc: Callable[[], Mapping[str, Any]]) -> None:
    click.echo(json.dumps(doc(), indent=2) if output == "json" else text())


@click.group(name="kubectl-gpupool")
def cli() -> None:
    """What gpupool has booked on each GPU, and why a pod waits (read-only)."""


@cli.command()
@click.argument("node", required=False)
@click.option("--agent-port", default=DEFAULT_AGENT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="The node agents' metrics port, read through the API server's node proxy for the "
                   "usage column (needs get on nodes/proxy); 0: do not read usage.")
@click.option("--agent-timeout", default=AGENT_TIMEOUT_S, show_default=True, type=click.FloatRange(0.1, 60),
              help="Seconds to wait for each node's agent.")
@connection_options
def inspect(node: str | None, agent_port: int, agent_timeout: float, kubeconfig: str | None, context: str | None,
            cluster_config: str, resource_domain: str | None, output: str) -> None:
    """Per node and card: model, memory and compute booked/total, health, usage, and the pods holding slices."""
    connection = _connect(kubeconfig, context)
    read = _settings(connection, cluster_config, resource_domain)
    try:
        nodes, pods = kube.list_nodes(connection), kube.list_pods(connection)
    except kube.ClusterAccessError as exc:
        raise click.ClickException(str(exc)) from None
    snapshot = with_settings_problems(build_snapshot(nodes, pods, read.settings.resource_names(), now=time.time(),
                                                     claims=_claims(connection),
                                                     unconfirmed_timeout_s=read.settings.unconfirmed_timeout),
                                      nodes, read)
    usage: UsageSource = NoUsage()
    if agent_port:
        agents = AgentUsage(lambda *ask: kube.read_node_proxy(connection, *ask), agent_port, agent_timeout)
        state = snapshot.state
        agents.fetch(spec.name for row, spec in enumerate(state.specs)
                     if state.present[row] and spec.cards and node in (None, spec.name))
        usage = agents
    views = node_views(snapshot, usage, only=node)
    if node is not None and not views:
        raise click.ClickException(f"node {node} not found")
    _emit(output, lambda: inspect_table(views), lambda: inspect_json(views, dict(snapshot.pod_problems)))


@cli.command()
@click.argument("pod")
@click.option("-n", "--namespace", default=None, help="The pod's namespace (default: the context's, else default).")
@click.option("--examples", default=EXAMPLES_PER_REASON, show_default=True,
              help="Nodes named under each reason (0: all).")
@click.option("--best", default=BEST_NODES, show_default=True, help="Fitting nodes named, best first.")
@click.option("--policy", default=None, type=click.Choice(sorted(POLICIES)),
              help="The placement policy to explain with [default: the ConfigMap's policy, which the extender "
                   f"runs with unless its --policy overrides it, else {ClusterSettings().policy}].")
@click.option("--agent-lease-namespace", default=None,
              help="Where the node agents renew their Leases [default: the ConfigMap's agentLeaseNamespace, else "
                   f"{ClusterSettings().agent_lease_namespace}].")
@click.option("--require-agent-lease/--no-require-agent-lease", default=None,
              help="Whether the extender refuses nodes without an agent Lease [default: the ConfigMap's "
                   "requireAgentLease (the production overlays and the chart set it), else no].")
@connection_options
def why(pod: str, namespace: str | None, examples: int, best: int, policy: str | None,
        agent_lease_namespace: str | None, require_agent_lease: bool | None, kubeconfig: str | None,
        context: str | None, cluster_config: str,
        resource_domain: str | None, output: str) -> None:
    """Why POD fits on no node by gpupool's booking (or where it fits), with the extender's reasons:
    cards, CPU and memory, groups, quotas and pools, pinned and avoided GPUs, agent Leases, loans."""
    connection = _connect(kubeconfig, context)
    read = _settings(connection, cluster_config, resource_domain)
    names = read.settings.resource_names()
    settings = read.settings.overridden({Setting.POLICY: policy, Setting.REQUIRE_AGENT_LEASE: require_agent_lease})
    try:
        raw = kube.read_pod(connection, namespace or connection.namespace, pod)
        nodes, pods = kube.list_nodes(connection), kube.list_pods(connection)
    except kube.ClusterAccessError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        request = pod_request(raw, names)
        tenant = pod_tenancy(raw, TenancyNames(names.domain))
    except TranslationError as exc:
        raise click.ClickException(f"gpupool cannot read the pod's request: {exc}") from None
    bound = str((raw.get("spec") or {}).get("nodeName") or "")
    if bound:
        click.echo(f"pod {pod_key(raw)} is already bound to node {bound}; see: kubectl gpupool inspect {bound}")
        return
    snapshot = with_settings_problems(
        build_snapshot(nodes, pods, names, now=time.time(), leave_out=frozenset({request.key}),
                       claims=_claims(connection), unconfirmed_timeout_s=settings.unconfirmed_timeout), nodes, read)
    lease_namespace = settings.agent_lease_namespace if agent_lease_namespace is None else agent_lease_namespace
    rules = read_rules(connection, snapshot.state, raw, request, tenant, nodes, settings, lease_namespace,
                       require=settings.require_agent_lease)
    answer = explain(snapshot, request, foreign_resources(raw), policy=settings.policy, best=best, rules=rules,
                     tenant=tenant)
    says = scheduler_message(raw)
    if not request.wants_gpu:
        click.echo(f"note: pod {request.key} asks for no gpupool resource; only its CPU and memory are checked",
                   err=True)
    _emit(output, lambda: why_text(answer, examples=examples, scheduler_says=says), lambda: why_json(answer, says))


def read_rules(connection: kube.Connection, state: ClusterState, raw: Mapping[str, Any], request: PodRequest,
               tenant: PodTenancy, nodes: list[dict[str, Any]], settings: ClusterSettings, lease_namespace: str, *,
               require: bool) -> ClusterRules:
    """The extender's rules beyond card fit for the pod ``raw`` (:mod:`gpupool.kubectl.rules`): each
    part read on its own, one that cannot be read a note instead of an error."""
    notes: list[str] = []
    domain = settings.resource_domain
    tenancy_names = TenancyNames(domain)
    book: TenancyBook | None = None
    try:
        groups = _custom_objects(connection, tenancy_names.api_group, "resourcegroups")
        quotas = _custom_objects(connection, tenancy_names.api_group, "gpuquotas")
    except kube.ClusterAccessError as exc:
        notes.append(f"resource groups, GPU quotas and pools not applied: {exc}")
    else:
        namespaces: list[dict[str, Any]] = []
        try:
            namespaces.append(kube.read_namespace(connection, tenant.namespace))
        except kube.ClusterAccessError as exc:
            notes.append(f"the namespace's default resource groups not applied: {exc}")
        book = tenancy_book(TenancyBook(tenancy_names), groups, quotas, namespaces)
    present = [spec.name for row, spec in enumerate(state.specs) if state.present[row]]
    refusals: dict[str, str] = {}
    try:
        if not lease_namespace:
            raise kube.ClusterAccessError("the agents renew no Lease (agentLeaseNamespace is empty)")
        leases = kube.list_leases(connection, lease_namespace, label_selector())
        refusals = lease_refusals(present, leases, lease_namespace, require=require, now=dt.datetime.now(dt.UTC))
    except kube.ClusterAccessError as exc:
        notes.append(f"node agent Leases not checked: {exc}")
    loans = loan_notes(nodes, raw, request.priority, LendingNames(domain), threshold=settings.high_priority_threshold)
    return ClusterRules(book, refusals, loans, tuple(notes))


def _custom_objects(connection: kube.Connection, group: str, plural: str) -> list[dict[str, Any]]:
    """Every object of a gpupool custom resource; none when its CRD is not installed (nothing to apply)."""
    try:
        return kube.list_custom(connection, group, API_VERSION, plural)
    except kube.NotServedError:
        return []


def scheduler_message(pod: Mapping[str, Any]) -> str | None:
    """The message of the pod's ``PodScheduled=False`` condition (kube-scheduler's last word), if any."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            message = condition.get("message")
            return str(message) if message else None
    return None


def main() -> None:
    """Entry point of the ``kubectl-gpupool`` console script."""
    cli(prog_name="kubectl gpupool")
