"""``gpupool extender``: run the kube-scheduler extender (HTTP server, watches, leader election).

This module only wires the pieces together; each piece has its own module under
``gpupool/extender`` (see docs/extender.md).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import click

from gpupool.api.agent_lease import label_selector
from gpupool.api.cluster_settings import CONFIG_MAP, DEFAULT_UNCONFIRMED_TIMEOUT_S, ClusterSettings
from gpupool.api.names import ResourceNames
from gpupool.cli import cluster_options
from gpupool.cli.cluster_options import ClusterFlags, cluster_setting_options, describe
from gpupool.cli.old_flags import old_spelling
from gpupool.cli.server_options import server_limit_options
from gpupool.core.policies import DEFAULT_POLICY
from gpupool.extender.admission import QuotaAdmission
from gpupool.extender.binder import DEFAULT_DEADLINE_S, Binder
from gpupool.extender.borrowing import BorrowSettings
from gpupool.extender.cache import ClusterCache
from gpupool.extender.claim_classes import TemplateClasses, WatchedClaimClasses
from gpupool.extender.claim_group_admission import ClaimGroupAdmission
from gpupool.extender.claim_pods import ClaimPodRequests
from gpupool.extender.client_image import client_image
from gpupool.extender.dra_watch import api_get, start_claim_watch, start_class_watch, start_template_watch
from gpupool.extender.gpupool_classes import GpupoolClasses
from gpupool.extender.group_subjects import GroupSubjectAdmission
from gpupool.extender.group_writes import GroupWriteAdmission, sar_permissions
from gpupool.extender.handover import BindFence, Handover, Unfenced
from gpupool.extender.housekeeping import Housekeeping
from gpupool.extender.http.admission_review import AdmissionApi
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.http.body import DEFAULT_MAX_BODY_BYTES
from gpupool.extender.http.serving import DEFAULT_HEALTH_PORT, Listeners, run_until_signalled, warn_if_open
from gpupool.extender.http.tls import DEFAULT_RELOAD_INTERVAL_S, ReloadingTls, TlsConfigError, TlsFiles
from gpupool.extender.leader_label import LEADER_LABEL, LeaderLabel, pod_ref
from gpupool.extender.lease import LeaderElector, LeaseSettings
from gpupool.extender.liveness import AgentLiveness
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.quota_status import QuotaStatusWriter
from gpupool.extender.remote_injection import RemoteInjection
from gpupool.extender.requeue import PreemptRequeue, cache_pending
from gpupool.extender.scheduler_steering import (
    DEFAULT_SCHEDULER,
    GPUPOOL_SCHEDULER,
    ClaimSource,
    SchedulerSteering,
)
from gpupool.extender.service import ExtenderService, ExtenderSettings
from gpupool.extender.takeover_fence import TakeoverFence, wants_gpu
from gpupool.extender.tenancy_watch import api_read_group, start_tenancy_watches
from gpupool.extender.wakeup import PendingWakeUp, filter_arguments
from gpupool.extender.watch import start_watches
from gpupool.kube.client_config import api_configuration
from gpupool.kube.listwatch import ListWatch
from gpupool.kube.podapi import KubePodApi
from gpupool.kube.waiting_pods import list_waiting_pods
from gpupool.netguard.limits import ServerLimits

log = logging.getLogger("gpupool.extender")


@dataclass(frozen=True)
class ExtenderOptions:
    """Everything ``gpupool extender`` can be told."""

    host: str = "0.0.0.0"
    port: int = 8888
    url_prefix: str = ""
    kubeconfig: str | None = None
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    """The settings shared with the node agents and the kubectl plugin (docs/cluster-config.md): the
    resource domain, gpushare's unit, HAMi's names, the high-priority threshold, the agents' Lease
    namespace; and the extender's rules the plugin mirrors (policy, requireAgentLease,
    unconfirmedTimeout). Nodes whose agents publish other values get no GPU pods."""
    cluster_config: str = CONFIG_MAP
    """The ConfigMap (``namespace/name``) they were read from, named in the refusals' advice."""
    policy: str = DEFAULT_POLICY
    unconfirmed_timeout_s: float = DEFAULT_UNCONFIRMED_TIMEOUT_S
    """The cluster's ``unconfirmedTimeout`` (:attr:`cluster`), as :attr:`policy` is its ``policy``."""
    leader_elect: bool = True
    lease_namespace: str = "kube-system"
    lease_name: str = "gpupool-extender"
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    """Leader-election timings (namespace and name come from the two fields above)."""
    identity: str = ""
    leader_pod: tuple[str, str] | None = None
    """This replica's own pod (namespace, name): labelled while it takes kube-scheduler's calls
    (gpupool/extender/leader_label.py); None leaves routing to readiness alone."""
    explain_limit: int = ExtenderSettings.explain_limit
    filter_best_only: bool = ExtenderSettings.filter_best_only
    """Filter passes only the policy's best nodes (what the shipped scheduler configurations, which have
    no prioritizeVerb, need; right under a configuration with prioritizeVerb too)."""
    filter_one_best: bool = ExtenderSettings.filter_one_best
    """Of the best nodes, filter passes the first in gpupool's node order (pods with soft preferences
    get them all)."""
    assume_s: float = ExtenderSettings.assume_s
    """How long the filter's choice of a pod's cards waits for its bind (docs/extender.md, "Assumed bookings")."""
    bind_deadline_s: float = DEFAULT_DEADLINE_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    tls: TlsFiles | None = None
    tls_reload_s: float = DEFAULT_RELOAD_INTERVAL_S
    health_port: int | None = None
    """Plain-HTTP port for probes and metrics; None: :data:`DEFAULT_HEALTH_PORT` with TLS, none without."""
    server_limits: ServerLimits = field(default_factory=ServerLimits)
    """Connection cap and handshake/header/idle timeouts of every port (docs/security.md, Bounded servers)."""
    require_agent_lease: bool = False
    tenancy: bool = True
    admission_port: int | None = None
    """The admission webhooks' TLS port (docs/tenancy.md); None: not served."""
    creator_subjects_webhook: bool = False
    """The pod-group webhook checks who creates or labels pods naming a group, so the filter trusts the
    label of a group with User or Group subjects (docs/tenancy.md, "Admission webhooks")."""
    lending: bool = True
    """Place low-priority pods on lent capacity (docs/lending.md, "In the extender"); who is low
    priority is :attr:`cluster`'s threshold."""
    scheduler_name: str = GPUPOOL_SCHEDULER
    """The scheduler the pod-scheduler webhook (on the admission port) gives GPU pods (docs/extender.md)."""
    remote_gpu_signer: tuple[str, str] | None = None
    """The CA Secret (namespace, name) the leader signs GPU nodes' serving certificates with
    (gpupool/extender/remote_gpu_signer.py); None: no signing."""
    remote_client_image: str | None = None
    """gpupool's image: the pod-scheduler webhook gives remote-share pods an init container of it that
    installs the GPU client, and mounts their grant (docs/remote-gpu.md); None: the extender's own
    image, read from its pod (``leader_pod``); ``"none"``: nothing injected."""
    dra_claims: bool = False
    """Watch ResourceClaims of gpupool's DRA driver and book them in the ledger (docs/dra.md, "One
    ledger"); readiness then waits for their first list."""
    steer_claim_pods: bool = False
    """The pod-scheduler webhook also gives gpupool's scheduler to pods whose ResourceClaims ask for
    gpupool's device class, whose extender chooses their node (docs/dra.md, "Steering claim pods");
    ResourceClaimTemplates are watched for it."""

    def resource_names(self) -> ResourceNames:
        """The names and units the extender reads pods with (one place for both replicas' paths)."""
        return self.cluster.resource_names()

    @property
    def borrow(self) -> BorrowSettings:
        """The lending switch with the cluster's one high-priority threshold."""
        return BorrowSettings(self.lending, self.cluster.high_priority_threshold)


def _clients(kubeconfig: str | None) -> tuple[Any, Any]:
    from kubernetes import client

    configuration = api_configuration(kubeconfig)
    configuration.connection_pool_maxsize = 32  # binds run on a pool of threads
    api_client = client.ApiClient(configuration)
    return client.CoreV1Api(api_client), client.CoordinationV1Api(api_client)


@dataclass
class Replica:
    """One running extender replica without its HTTP server (what a test drives in process)."""

    cache: ClusterCache
    service: ExtenderService
    pod_watch: ListWatch
    elector: LeaderElector | None
    stop: threading.Event
    identity: str
    housekeeping: Housekeeping
    liveness: AgentLiveness | None = None
    requeue: PreemptRequeue | None = None
    wakeup: PendingWakeUp | None = None
    quota_status: QuotaStatusWriter | None = None
    templates: TemplateClasses | None = None
    """ResourceClaimTemplates' classes, watched with ``steer_claim_pods`` (the pod-scheduler webhook's)."""

    def shutdown(self) -> None:
        """Stop renewing the Lease and watching (a replica that has died, as far as others see)."""
        self.stop.set()
        if self.elector is not None:
            self.elector.stop.set()


def service_settings(options: ExtenderOptions) -> ExtenderSettings:
    """The service's tunables among the options."""
    return ExtenderSettings(explain_limit=options.explain_limit, filter_best_only=options.filter_best_only,
                            filter_one_best=options.filter_one_best, assume_s=options.assume_s)


def start_replica(options: ExtenderOptions, core_v1: Any, coordination_v1: Any,
                  lease: LeaseSettings | None = None) -> Replica:
    """Start the watches and leader election of one replica and wire its service.

    ``lease`` overrides the timings (tests shorten them); namespace and name come from ``options``.
    """
    names = options.resource_names()
    cache = ClusterCache(names, policy=options.policy, unconfirmed_timeout_s=options.unconfirmed_timeout_s,
                         tenancy_required=options.tenancy, borrow=options.borrow, settings=options.cluster,
                         settings_source=options.cluster_config or CONFIG_MAP)
    stop = threading.Event()
    _, pod_watch = start_watches(cache, core_v1, stop)
    if options.tenancy:  # resource groups, GPU quotas, namespaces' default groups (docs/tenancy.md)
        start_tenancy_watches(cache, core_v1.api_client, stop)
    if options.dra_claims:  # DRA claims on the same ledger (docs/dra.md, "One ledger")
        start_claim_watch(cache, core_v1.api_client, stop)
    templates = None
    if options.steer_claim_pods:  # which class a pod's claim templates ask for (docs/dra.md, "Steering claim pods")
        templates = TemplateClasses(cache.claims.classes)
        start_template_watch(templates, core_v1.api_client, stop)
        # admins' DeviceClasses of gpupool's driver and their selectors (docs/dra.md, "Selectors the extender reads")
        start_class_watch(GpupoolClasses(cache.claims, cache.lock, templates), core_v1.api_client, stop)
    identity = options.identity or f"{socket.gethostname()}_{os.getpid()}"
    lease = dataclasses.replace(lease or options.lease, namespace=options.lease_namespace,
                                name=options.lease_name)
    elector = None
    handover: Handover | None = None
    fence: BindFence = Unfenced()
    pod_api = KubePodApi(core_v1, patch_timeout_s=lease.commit_timeout_s)
    if options.leader_elect:
        elector = LeaderElector(coordination_v1, identity, lease)
        # a new term binds only after the waiting GPU pods are fenced against the previous leader's
        # late binds and a quorum list of pods is in the ledger (docs/extender.md, HA)
        takeover_fence = TakeoverFence(pod_api, lambda: list_waiting_pods(core_v1), wants_gpu(cache.requests),
                                       identity, names.domain)
        handover = Handover(elector, pod_watch.catch_up, stop=stop, fence=takeover_fence)
        elector.on_started_leading = handover.started_leading
        fence = handover
        elector.start()
    liveness = _watch_agent_leases(options, cache, coordination_v1, stop)
    requeue = PreemptRequeue(pod_api, names.domain, pending=cache_pending(cache))  # retry preemptors promptly
    cache.release_listeners.append(requeue.released)
    service = ExtenderService(cache, Binder(cache, pod_api, deadline_s=options.bind_deadline_s, fence=fence),
                              settings=service_settings(options),
                              is_leader=elector.is_leader if elector else (lambda: True),
                              leader_name=elector.holder if elector else (lambda: identity),
                              node_gate=liveness.refusals if liveness else (lambda _: {}),
                              preempt_answers=requeue, bind_refusal=fence.refusal)
    housekeeping = Housekeeping(cache, pod_api, is_leader=service.is_leader)
    cache.admissions.creators_checked = options.creator_subjects_webhook
    quota_status = None
    if options.tenancy:  # the leader writes each GpuQuota's used and hard amounts (docs/tenancy.md)
        from kubernetes import client

        quota_status = QuotaStatusWriter(cache, client.CustomObjectsApi(core_v1.api_client), service.is_leader)
    # refused pods are retried when a quota, group, loan, card or agent Lease lets them fit
    wakeup = PendingWakeUp(pod_api, cache, service.fits_somewhere, pending=cache_pending(cache),
                           node_gate=service.node_gate, domain=names.domain)
    service.refused = wakeup
    if handover is not None:  # a new leader adopts the pods its predecessor may have refused
        handover.caught_up_listeners.append(lambda: wakeup.adopt(list_waiting_pods(core_v1), filter_arguments(cache)))
    return Replica(cache, service, pod_watch, elector, stop, identity, housekeeping, liveness, requeue,
                   quota_status=quota_status, wakeup=wakeup, templates=templates)


def _watch_agent_leases(options: ExtenderOptions, cache: ClusterCache, coordination_v1: Any,
                        stop: threading.Event) -> AgentLiveness | None:
    """The node agents' Leases, watched (gpupool/extender/liveness.py); None when turned off."""
    namespace = options.cluster.agent_lease_namespace
    if not namespace:
        return None
    liveness = AgentLiveness(namespace, require=options.require_agent_lease, ledger_lock=cache.lock)
    leases = functools.partial(coordination_v1.list_namespaced_lease, namespace,
                               label_selector=label_selector())
    ListWatch("agent-leases", leases, liveness.replace, liveness.apply, stop=stop).start()
    return liveness


def run_extender(options: ExtenderOptions) -> None:
    """Start watches, leader election and the HTTP server; blocks until interrupted."""

    names = options.resource_names()
    core_v1, coordination_v1 = _clients(options.kubeconfig)
    replica = start_replica(options, core_v1, coordination_v1)
    service, identity = replica.service, replica.identity
    replica.housekeeping.start(replica.stop)  # expiry, profile refresh, Events (gpupool/extender/housekeeping.py)
    if replica.quota_status is not None:
        replica.quota_status.start(replica.stop)
    if replica.requeue is not None:
        replica.requeue.start(replica.stop)  # nudges preemptors whose victims are gone (gpupool/extender/requeue.py)
    if replica.wakeup is not None:
        replica.wakeup.start(replica.stop)  # nudges refused pods a change lets fit (gpupool/extender/wakeup.py)
    if options.remote_gpu_signer is not None:  # GPU nodes' own serving certificates (docs/remote-gpu.md, "Trust")
        from kubernetes import client

        from gpupool.extender.remote_gpu_signer import CaSecret, start_signer

        start_signer(client.CertificatesV1Api(core_v1.api_client), core_v1,
                     CaSecret(core_v1, *options.remote_gpu_signer), replica.stop, service.is_leader)
    cache = replica.cache
    api = ExtenderApi(service, names, ExtenderMetrics(ledger=cache), max_body_bytes=options.max_body_bytes,
                      requests=cache.requests,
                      claim_pods=ClaimPodRequests(cache.claims, cache.lock) if options.dra_claims else None)
    listeners = _listeners(options)
    admission = None
    if listeners.admission_port is not None:
        remote_image = client_image(options.remote_client_image, options.leader_pod, core_v1.read_namespaced_pod)
        claims = None
        if replica.templates is not None:
            claims = WatchedClaimClasses(cache.claims, cache.lock, replica.templates, api_get(core_v1.api_client))
        admission = _admission_app(cache, api, core_v1, options.scheduler_name, remote_image, claims=claims,
                                   check_server_name=options.remote_gpu_signer is not None)
    warn_if_open(listeners)
    log.info("gpupool extender %s listening on %s:%d (%s; policy %s, domain %s)%s", identity, options.host,
             options.port, "HTTPS" if listeners.tls else "HTTP", options.policy, options.cluster.resource_domain,
             f", health on :{listeners.health_port}" if listeners.health_port else "")
    label = _leader_label(options, core_v1, service, replica.stop)
    try:
        run_until_signalled(api.app(options.url_prefix), api.probe_app(), listeners, admission)
    finally:
        if label is not None:  # kube-scheduler's Service stops routing here before the Lease moves on
            label.clear()
        if replica.elector is not None:  # a clean stop hands the Lease over at once (not on SIGKILL)
            replica.elector.release()
        replica.shutdown()


def _leader_label(options: ExtenderOptions, core_v1: Any, service: ExtenderService,
                  stop: threading.Event) -> LeaderLabel | None:
    """``--leader-pod``: the label on this replica's pod kept in step with ``service.unready()``."""
    if options.leader_pod is None:
        return None
    namespace, name = options.leader_pod
    timeout = options.lease.commit_timeout_s

    def patch(body: dict[str, Any]) -> object:
        return core_v1.patch_namespaced_pod(name, namespace, body, _request_timeout=timeout)

    def unlabel_others() -> list[str]:
        pods = core_v1.list_namespaced_pod(namespace, label_selector=f"{LEADER_LABEL}=true",
                                           _request_timeout=timeout)
        others = [pod.metadata.name for pod in pods.items if pod.metadata.name != name]
        for other in others:
            core_v1.patch_namespaced_pod(other, namespace, {"metadata": {"labels": {LEADER_LABEL: None}}},
                                         _request_timeout=timeout)
        return others

    label = LeaderLabel(patch, lambda: not service.unready(), unlabel_others=unlabel_others)
    label.start(stop)
    return label


def _admission_app(cache: ClusterCache, api: ExtenderApi, core_v1: Any, scheduler_name: str,
                   remote_client_image: str | None = None, *, claims: ClaimSource | None = None,
                   check_server_name: bool = False) -> Any:
    """The webhooks' application: quotas at pod creation, groups' subjects on pods naming a group,
    the requester's permission on ResourceGroup writes (SubjectAccessReviews as the extender), and
    the scheduler of new GPU pods (``scheduler_name``, gpupool's own), with the GPU client and its
    grant for remote shares when ``remote_client_image`` is given; with ``claims``, pods whose
    claims ask for gpupool's device class are steered too; with ``check_server_name`` (GPU nodes'
    own certificates are signed) the client checks its server node's name in the certificate; new
    ResourceClaims get the selectors that keep them on their resource groups' cards."""
    from kubernetes import client

    return AdmissionApi(QuotaAdmission(cache, api.names), api.metrics, api.bodies,
                        pod_groups=GroupSubjectAdmission(cache, cache.tenancy.names, api_read_group(
                            core_v1.api_client, cache.tenancy.names.api_group)),
                        group_writes=GroupWriteAdmission(sar_permissions(
                            client.AuthorizationV1Api(core_v1.api_client))),
                        steering=SchedulerSteering(api.names, scheduler_name, claims=claims),
                        remote_injection=RemoteInjection(api.names, remote_client_image,
                                                         check_server_name=check_server_name)
                        if remote_client_image else None,
                        claim_groups=ClaimGroupAdmission(cache, cache.claims)).app()


def _listeners(options: ExtenderOptions) -> Listeners:
    tls = ReloadingTls(options.tls, options.tls_reload_s) if options.tls is not None else None
    health = options.health_port
    if health is None:
        health = DEFAULT_HEALTH_PORT if tls is not None else 0
    admission_tls = None
    if options.admission_port is not None and options.tls is not None:
        admission_tls = ReloadingTls(dataclasses.replace(options.tls, client_ca_file=None), options.tls_reload_s)
    return Listeners(options.host, options.port, tls, health or None, options.admission_port, admission_tls,
                     options.server_limits)


def tls_files(cert: str | None, key: str | None, client_ca: str | None) -> TlsFiles | None:
    """The TLS flags as one value; both or neither of the certificate and its key."""
    if cert is None and key is None:
        if client_ca is not None:
            raise click.UsageError("--client-ca-file needs --tls-cert-file and --tls-private-key-file")
        return None
    if cert is None or key is None:
        raise click.UsageError("--tls-cert-file and --tls-private-key-file go together")
    files = TlsFiles(cert, key, client_ca)
    try:
        ReloadingTls(files)  # load once now: a wrong file is a usage error, not a crash at start-up
    except TlsConfigError as exc:
        raise click.UsageError(str(exc)) from None
    return files


@click.command("extender")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=8888, show_default=True, type=int, help="Port to listen on.")
@click.option("--url-prefix", default="", help="Path prefix of the verbs (the path part of urlPrefix).")
@click.option("--kubeconfig", default=None, type=click.Path(dir_okay=False),
              help="Kubeconfig file; default: in-cluster config, else ~/.kube/config.")
@click.option("--leader-elect/--no-leader-elect", default=True, show_default=True,
              help="Bind only while holding the Lease (run several replicas for HA).")
@click.option("--leader-elect-resource-namespace", "lease_namespace", default="kube-system", show_default=True,
              help="Namespace of the leader-election Lease (kube-scheduler's flag names).")
@click.option("--leader-elect-resource-name", "lease_name", default="gpupool-extender", show_default=True,
              help="Name of the leader-election Lease.")
@click.option("--identity", default="", help="Leader-election identity (default: hostname_pid).")
@click.option("--leader-pod", default="", metavar="NAMESPACE/NAME",
              help="This replica's pod: keep the label gpupool.io/extender-leader=true on it while it takes "
                   "kube-scheduler's calls, for a Service that selects the leader while every synced replica is "
                   "Ready (/syncz) and the Deployment can roll (docs/extender.md, High availability).")
@click.option("--leader-elect-lease-duration", "lease_duration", default=LeaseSettings.lease_duration,
              show_default=True, type=click.FloatRange(min=1),
              help="Seconds a candidate waits after it last saw the Lease change before taking it over.")
@click.option("--leader-elect-renew-deadline", "renew_deadline", default=LeaseSettings.renew_deadline,
              show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds after its last renewal began that a leader stops binding (below the lease duration).")
@click.option("--leader-elect-retry-period", "retry_period", default=LeaseSettings.retry_period, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds between attempts to acquire or renew the Lease (docs/extender.md, High availability).")
@click.option("--explain-limit", default=ExtenderSettings.explain_limit, show_default=True, type=int,
              help="Failed nodes given an individual reason per filter call.")
@click.option("--filter-best-only/--no-filter-best-only", default=ExtenderSettings.filter_best_only, show_default=True,
              help="Filter passes only the nodes the policy scores best (the others get a reason): needed by "
                   "deploy/scheduler-config-*.yaml (no prioritizeVerb); --no-filter-best-only passes every node "
                   "that fits, for the -prioritize.yaml variants (docs/extender.md, Filter best only).")
@click.option("--filter-one-best/--filter-all-best", default=ExtenderSettings.filter_one_best, show_default=True,
              help="With --filter-best-only: pass one of the best nodes, the first in gpupool's fixed node order "
                   "(kube-scheduler then skips its scoring, and the pod goes where the simulator would put it); "
                   "pods with soft preferences, and --filter-all-best, get every best node "
                   "(docs/extender.md, One best node).")
@click.option("--assume-deadline", default=ExtenderSettings.assume_s, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds the filter's choice for a pod it passes one node stays booked when no bind of the pod "
                   "comes (keep it a little above kube-scheduler's httpTimeout; docs/extender.md, Assumed bookings).")
@click.option("--bind-deadline", default=DEFAULT_DEADLINE_S, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds a bind may take across its retries (keep it below kube-scheduler's httpTimeout).")
@click.option("--max-body-bytes", default=DEFAULT_MAX_BODY_BYTES, show_default=True, type=click.IntRange(min=1),
              help="Largest request body read; larger ones get 413 (docs/extender.md, Limits).")
@click.option("--tls-cert-file", type=click.Path(dir_okay=False),
              help="Serve the verbs over HTTPS with this certificate (PEM); reloaded when it changes.")
@click.option("--tls-private-key-file", type=click.Path(dir_okay=False),
              help="The private key of --tls-cert-file (PEM).")
@click.option("--client-ca-file", type=click.Path(dir_okay=False),
              help="Accept only clients with a certificate signed by this CA (kube-scheduler's tlsConfig).")
@click.option("--health-port", type=click.IntRange(0, 65535), default=None,
              help=f"Plain-HTTP port for /healthz, /readyz, /metrics only [default: {DEFAULT_HEALTH_PORT} "
                   "with TLS, none without; 0: none].")
@click.option("--tls-reload-interval", default=DEFAULT_RELOAD_INTERVAL_S, show_default=True,
              type=click.FloatRange(min=0, min_open=True), help="Seconds between checks of the TLS files.")
@click.option("--tenancy/--no-tenancy", default=True, show_default=True,
              help="Watch ResourceGroups, GpuQuotas and Namespaces and apply them (docs/tenancy.md).")
@click.option("--admission-port", type=click.IntRange(1, 65535), default=None,
              help="Serve the GPU quota admission webhook (POST /admission/pods) on this HTTPS port, with "
                   "--tls-cert-file and no client certificate asked (docs/tenancy.md) [default: not served].")
@click.option("--creator-subjects-webhook", is_flag=True, default=False,
              help="With --admission-port: the apiserver calls the pod-group webhook (components/quota-webhook) for "
                   "every pod naming a group, so the filter lets a ResourceGroup's User and Group subjects admit "
                   "the pods they create (docs/tenancy.md) [default: such subjects admit no pod].")
@click.option("--scheduler-name", default=GPUPOOL_SCHEDULER, show_default=True,
              help="With --admission-port: the pod-scheduler webhook (POST /admission/pod-scheduler) sets this "
                   "spec.schedulerName on new pods that ask for gpupool's resources: the profile of gpupool's own "
                   "kube-scheduler (docs/extender.md, \"Own scheduler\").")
@click.option("--remote-client-image", default=None,
              help="With --admission-port: gpupool's image; the pod-scheduler webhook gives each pod asking for a "
                   "remote share an init container of it installing the GPU client, LD_PRELOAD and its grant "
                   "Secret's volume (docs/remote-gpu.md, \"What the webhook injects\"); 'none': nothing injected "
                   "[default: the extender's own image, read from --leader-pod; without it nothing injected].")
@click.option("--remote-gpu-signer", default=None, metavar="NAMESPACE/SECRET",
              help="Sign GPU nodes' own remote GPU serving certificates (CertificateSigningRequests of signer "
                   "gpupool.io/remote-gpu-server from the node agents, each checked against the requester's node; "
                   "docs/remote-gpu.md, \"Trust\") with the CA in this kubernetes.io/tls Secret (gpupool certs "
                   "remote-gpu-ca makes it) [default: not signed].")
@click.option("--lending/--no-lending", default=True, show_default=True,
              help="Place low-priority pods that fit no free capacity on cards nodes lend (docs/lending.md).")
@click.option("--dra-claims/--no-dra-claims", default=False, show_default=True,
              help="Book ResourceClaims allocated from gpupool's DRA driver in the ledger, beside the "
                   "extended-resource pods (docs/dra.md, \"One ledger\"; Kubernetes 1.34+).")
@click.option("--steer-claim-pods/--no-steer-claim-pods", default=False, show_default=True,
              help="With --dra-claims and --admission-port: the pod-scheduler webhook also sets gpupool's scheduler "
                   "on pods whose ResourceClaims (or their templates, watched) ask for gpupool's device class, "
                   "and the extender chooses their node (gpupool's scheduler must list no managedResources; "
                   "docs/dra.md, \"Steering claim pods\").")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@server_limit_options(tls=True)
@cluster_setting_options(old_lease_namespace=False, extender_rules=True)
@old_spelling("--lease-namespace", "--leader-elect-resource-namespace", "lease_namespace")
@old_spelling("--lease-name", "--leader-elect-resource-name", "lease_name")
@old_spelling("--lease-duration", "--leader-elect-lease-duration", "lease_duration", type=click.FloatRange(min=1))
@old_spelling("--renew-deadline", "--leader-elect-renew-deadline", "renew_deadline",
              type=click.FloatRange(min=0, min_open=True))
@old_spelling("--retry-period", "--leader-elect-retry-period", "retry_period",
              type=click.FloatRange(min=0, min_open=True))
def extender(host: str, port: int, url_prefix: str, kubeconfig: str | None,
             leader_elect: bool, lease_namespace: str, lease_name: str,
             identity: str, leader_pod: str, lease_duration: float, renew_deadline: float, retry_period: float,
             explain_limit: int, filter_best_only: bool, filter_one_best: bool, assume_deadline: float,
             bind_deadline: float,
             max_body_bytes: int,
             tls_cert_file: str | None, tls_private_key_file: str | None, client_ca_file: str | None,
             health_port: int | None, tls_reload_interval: float,
             tenancy: bool,
             admission_port: int | None, creator_subjects_webhook: bool, scheduler_name: str,
             remote_client_image: str | None, remote_gpu_signer: str | None, lending: bool,
             dra_claims: bool, steer_claim_pods: bool, verbose: bool, server_limits: ServerLimits,
             cluster_flags: ClusterFlags) -> None:
    """Run the kube-scheduler extender (filter, prioritize, bind, preempt)."""
    from gpupool.extender.remote_gpu_signer import secret_ref

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tls = tls_files(tls_cert_file, tls_private_key_file, client_ca_file)
    try:
        lease = LeaseSettings(lease_duration=lease_duration, renew_deadline=renew_deadline, retry_period=retry_period)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if admission_port is not None and (tls is None or not tenancy):
        raise click.UsageError("--admission-port needs --tls-cert-file and --tls-private-key-file (the apiserver "
                               "calls webhooks over HTTPS only) and the tenancy watches (no --no-tenancy)")
    if creator_subjects_webhook and admission_port is None:
        raise click.UsageError("--creator-subjects-webhook needs --admission-port (the extender serves that webhook)")
    if steer_claim_pods and (not dra_claims or admission_port is None):
        raise click.UsageError("--steer-claim-pods needs --dra-claims (the extender reads claims from its claim "
                               "watch) and --admission-port (the webhook steers the pods)")
    if scheduler_name in ("", DEFAULT_SCHEDULER):
        raise click.UsageError(f"--scheduler-name must name gpupool's own scheduler, not {scheduler_name!r}")
    try:
        own_pod = pod_ref(leader_pod) if leader_pod else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--leader-pod") from None
    try:
        signer_ca = secret_ref(remote_gpu_signer) if remote_gpu_signer else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--remote-gpu-signer") from None
    cluster = cluster_flags.resolve(cluster_options.read_with_client(kubeconfig))
    log.info("cluster settings: %s", describe(cluster, cluster_flags))
    run_extender(ExtenderOptions(host=host, port=port, url_prefix=url_prefix, kubeconfig=kubeconfig,
                                 cluster=cluster, cluster_config=cluster_flags.config_map, policy=cluster.policy,
                                 unconfirmed_timeout_s=cluster.unconfirmed_timeout,
                                 leader_elect=leader_elect, lease_namespace=lease_namespace,
                                 lease_name=lease_name, lease=lease, identity=identity, leader_pod=own_pod,
                                 explain_limit=explain_limit,
                                 filter_best_only=filter_best_only, filter_one_best=filter_one_best,
                                 assume_s=assume_deadline, bind_deadline_s=bind_deadline,
                                 max_body_bytes=max_body_bytes, tls=tls,
                                 tls_reload_s=tls_reload_interval, health_port=health_port,
                                 require_agent_lease=cluster.require_agent_lease, tenancy=tenancy,
                                 admission_port=admission_port, creator_subjects_webhook=creator_subjects_webhook,
                                 lending=lending, dra_claims=dra_claims, steer_claim_pods=steer_claim_pods,
                                 scheduler_name=scheduler_name, remote_client_image=remote_client_image,
                                 remote_gpu_signer=signer_ca, server_limits=server_limits))
