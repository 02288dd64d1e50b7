"""``gpupool extender``: run the kube-scheduler extender (HTTP server, watches, leader election).

This module only wires the pieces together; each piece has its own module under
``gpupool/extender`` (see docs/extender.md).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

import click

from gpupool.api.names import DEFAULT_DOMAIN, ResourceNames
from gpupool.core.policies import DEFAULT_POLICY, POLICIES
from gpupool.extender.binder import DEFAULT_DEADLINE_S, Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.handover import BindFence, Handover, Unfenced
from gpupool.extender.housekeeping import Housekeeping
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.http.body import DEFAULT_MAX_BODY_BYTES
from gpupool.extender.lease import LeaderElector, LeaseSettings
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService, ExtenderSettings
from gpupool.extender.tenancy_watch import start_tenancy_watches
from gpupool.extender.watch import start_watches
from gpupool.kube.client_config import api_configuration
from gpupool.kube.listwatch import ListWatch
from gpupool.kube.podapi import KubePodApi

log = logging.getLogger("gpupool.extender")


@dataclass(frozen=True)
class ExtenderOptions:
    """Everything ``gpupool extender`` can be told."""

    host: str = "0.0.0.0"
    port: int = 8888
    url_prefix: str = ""
    kubeconfig: str | None = None
    domain: str = DEFAULT_DOMAIN
    policy: str = DEFAULT_POLICY
    unconfirmed_timeout_s: float = 300.0
    leader_elect: bool = True
    lease_namespace: str = "kube-system"
    lease_name: str = "gpupool-extender"
    identity: str = ""
    explain_limit: int = 64
    bind_deadline_s: float = DEFAULT_DEADLINE_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    tenancy: bool = True


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

    def shutdown(self) -> None:
        """Stop renewing the Lease and watching (a replica that has died, as far as others see)."""
        self.stop.set()
        if self.elector is not None:
            self.elector.stop.set()


def start_replica(options: ExtenderOptions, core_v1: Any, coordination_v1: Any,
                  lease: LeaseSettings | None = None) -> Replica:
    """Start the watches and leader election of one replica and wire its service.

    ``lease`` overrides the timings (tests shorten them); namespace and name come from ``options``.
    """
    names = ResourceNames(options.domain)
    cache = ClusterCache(names, policy=options.policy, unconfirmed_timeout_s=options.unconfirmed_timeout_s,
                         tenancy_required=options.tenancy)
    stop = threading.Event()
    _, pod_watch = start_watches(cache, core_v1, stop)
    if options.tenancy:  # resource groups, GPU quotas, namespaces' default groups (docs/tenancy.md)
        start_tenancy_watches(cache, core_v1.api_client, stop)
    identity = options.identity or f"{socket.gethostname()}_{os.getpid()}"
    lease = dataclasses.replace(lease or LeaseSettings(), namespace=options.lease_namespace,
                                name=options.lease_name)
    elector = None
    fence: BindFence = Unfenced()
    if options.leader_elect:
        elector = LeaderElector(coordination_v1, identity, lease)
        # a new term binds only after a quorum list of pods is in the ledger (docs/extender.md, HA)
        handover = Handover(elector, pod_watch.catch_up, stop=stop)
        elector.on_started_leading = handover.started_leading
        fence = handover
        elector.start()
    pod_api = KubePodApi(core_v1, patch_timeout_s=lease.commit_timeout_s)
    service = ExtenderService(cache, Binder(cache, pod_api, deadline_s=options.bind_deadline_s, fence=fence),
                              settings=ExtenderSettings(explain_limit=options.explain_limit),
                              is_leader=elector.is_leader if elector else (lambda: True),
                              leader_name=elector.holder if elector else (lambda: identity))
    housekeeping = Housekeeping(cache, pod_api, is_leader=service.is_leader)
    return Replica(cache, service, pod_watch, elector, stop, identity, housekeeping)


def run_extender(options: ExtenderOptions) -> None:
    """Start watches, leader election and the HTTP server; blocks until interrupted."""
    from aiohttp import web

    names = ResourceNames(options.domain)
    core_v1, coordination_v1 = _clients(options.kubeconfig)
    replica = start_replica(options, core_v1, coordination_v1)
    service, identity = replica.service, replica.identity
    replica.housekeeping.start(replica.stop)  # expiry, profile refresh, Events (gpupool/extender/housekeeping.py)
    app = ExtenderApi(service, names, ExtenderMetrics(), max_body_bytes=options.max_body_bytes).app(options.url_prefix)
    log.info("gpupool extender %s listening on %s:%d (policy %s, domain %s)", identity, options.host,
             options.port, options.policy, options.domain)
    try:
        web.run_app(app, host=options.host, port=options.port, print=None, access_log=None)
    finally:
        replica.shutdown()


@click.command("extender")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=8888, show_default=True, type=int, help="Port to listen on.")
@click.option("--url-prefix", default="", help="Path prefix of the verbs (the path part of urlPrefix).")
@click.option("--kubeconfig", default=None, type=click.Path(dir_okay=False),
              help="Kubeconfig file; default: in-cluster config, else ~/.kube/config.")
@click.option("--domain", default=DEFAULT_DOMAIN, show_default=True,
              help="Domain of resource and annotation names.")
@click.option("--policy", default=DEFAULT_POLICY, show_default=True, type=click.Choice(sorted(POLICIES)),
              help="Placement policy for prioritize and for choosing cards.")
@click.option("--unconfirmed-timeout", default=300.0, show_default=True, type=float,
              help="Seconds after which an assignment whose pod was never bound is dropped.")
@click.option("--leader-elect/--no-leader-elect", default=True, show_default=True,
              help="Bind only while holding the Lease (run several replicas for HA).")
@click.option("--lease-namespace", default="kube-system", show_default=True)
@click.option("--lease-name", default="gpupool-extender", show_default=True)
@click.option("--identity", default="", help="Leader-election identity (default: hostname_pid).")
@click.option("--explain-limit", default=64, show_default=True, type=int,
              help="Failed nodes given an individual reason per filter call.")
@click.option("--bind-deadline", default=DEFAULT_DEADLINE_S, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds a bind may take across its retries (keep it below kube-scheduler's httpTimeout).")
@click.option("--max-body-bytes", default=DEFAULT_MAX_BODY_BYTES, show_default=True, type=click.IntRange(min=1),
              help="Largest request body read; larger ones get 413 (docs/extender.md, Limits).")
@click.option("--tenancy/--no-tenancy", default=True, show_default=True,
              help="Watch ResourceGroups, GpuQuotas and Namespaces and apply them (docs/tenancy.md).")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def extender(host: str, port: int, url_prefix: str, kubeconfig: str | None, domain: str, policy: str,
             unconfirmed_timeout: float, leader_elect: bool, lease_namespace: str, lease_name: str,
             identity: str, explain_limit: int, bind_deadline: float, max_body_bytes: int, tenancy: bool,
             verbose: bool) -> None:
    """Run the kube-scheduler extender (filter, prioritize, bind, preempt)."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_extender(ExtenderOptions(host=host, port=port, url_prefix=url_prefix, kubeconfig=kubeconfig,
                                 domain=domain, policy=policy, unconfirmed_timeout_s=unconfirmed_timeout,
                                 leader_elect=leader_elect, lease_namespace=lease_namespace,
                                 lease_name=lease_name, identity=identity, explain_limit=explain_limit,
                                 bind_deadline_s=bind_deadline, max_body_bytes=max_body_bytes, tenancy=tenancy))
