"""The extender's HTTP endpoints (aiohttp): ``POST /filter``, ``/prioritize``, ``/bind``, ``/preempt``.

Also ``GET /healthz`` (the process answers), ``/readyz`` (kube-scheduler's calls belong here: synced
and, under leader election, leading), ``/syncz`` (the cache has synced) and ``/metrics``.

Why these status codes: kube-scheduler discards the body of a non-200 answer, so every answer about
a *pod* (it does not fit, its annotation is broken, the cache is not ready, this replica is not the
leader) is a 200 with ``Error`` set, which kube-scheduler shows in the pod's events. Only a request
that is not an extender document at all (malformed JSON, nested past 64 levels:
:mod:`gpupool.extender.http.body`; missing fields) or that carries a value the apiserver itself
refuses (a quantity such as ``inf``, ``NaN`` or thousands of digits; it never came from a cluster)
gets a 400, a body past the size cap a 413 and one past the in-flight budget a 503
(:mod:`gpupool.extender.http.body`), and a bug gets a 500; all carry a JSON ``Error``. No input can
crash the server.

Bodies are read and written with orjson: a filter answer carries up to one reason per node (5,000
strings) and a request up to 5,000 names; orjson writes such an answer several times faster than the
standard library's encoder (docs/extender.md, "Latency and throughput work"), with the same JSON
(compact separators, keys in insertion order; non-ASCII text is written as UTF-8 rather than ``\\u``
escapes, which every JSON reader, Go's included, treats alike).

Filter and prioritize run on the event loop: they are a few milliseconds of numpy under the cache
lock, and a thread hop would cost more than it saves. Bind calls the API, so it runs in a thread pool.
A ``/metrics`` scrape is rendered on a thread of its own: however long rendering takes, the loop
keeps answering filter and prioritize (the ledger lock is held only while the totals are copied).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpupool.api.names import ResourceNames
from gpupool.api.tenancy import TenancyNames
from gpupool.core.model import PodRequest
from gpupool.extender.claim_pods import ClaimPodRequests
from gpupool.extender.http.body import (
    DEFAULT_MAX_BODY_BYTES,
    BodiesBusyError,
    BodyReader,
    BodyTooLargeError,
    UnreadableJsonError,
    load_json_body,
)
from gpupool.extender.http.host_records import RecordsForLayout
from gpupool.extender.http.wire import (
    ExtenderArgs,
    FilterResult,
    HostPriorityEncoder,
    WireError,
    binding_result,
    format_safe,
    format_safe_reasons,
    parse_binding_args,
    parse_extender_args,
    parse_preemption_args,
    preemption_result,
)
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.request_memo import RequestMemo
from gpupool.extender.service import ExtenderService, NodeScores
from gpupool.kube.tenancy import PodTenancy, pod_tenancy
from gpupool.kube.translate import InvalidObjectError, TranslationError, foreign_resources

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[tuple[Any, str]]]

NOT_LEADER = "not_leader"
"""The outcome (metrics label) of a verb answered by a replica that would not bind now: a follower,
or a new leader still catching up. Filter answers :func:`not_binding_error`, prioritize its scores
(kube-scheduler ignores a prioritize error anyway), bind the service's refusal; each closes the
connection (docs/extender.md, "High availability")."""


def not_binding_error(reason: str) -> str:
    """The filter ``Error`` of a replica that would refuse the pod's bind: kube-scheduler puts the pod
    in its backoff queue (1 s, doubling to 10 s) and its next try connects through the Service."""
    return f"this gpupool extender replica does not bind now ({reason}); retry shortly"

class RawJson:
    """A response body that is already encoded JSON (built faster than a generic encoder would)."""

    def __init__(self, data: bytes) -> None:
        self.data = data


BIND_WORKERS = 32
"""Threads that run binds (each mostly waits on its API write; as many as the API client's pool
keeps connections, gpupool/cli/extender_cmd.py). kube-scheduler binds asynchronously and filters
the next pods meanwhile, so binds arrive as fast as it schedules: with 8 threads they queued past
its 10 s ``httpTimeout`` at 1,000 nodes (1,355 binds timed out in ``bench/e2e_scheduling.py``) once
the filter no longer waited for the last pod's booking (docs/extender.md, "Assumed bookings")."""

SERVICE_KEY: web.AppKey[ExtenderService] = web.AppKey("service", ExtenderService)
METRICS_KEY: web.AppKey[ExtenderMetrics] = web.AppKey("metrics", ExtenderMetrics)


class ExtenderApi:
    """Binds an :class:`ExtenderService` to HTTP routes."""

    def __init__(self, service: ExtenderService, names: ResourceNames, metrics: ExtenderMetrics,
                 bind_workers: int = BIND_WORKERS, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, *,
                 requests: RequestMemo | None = None, claim_pods: ClaimPodRequests | None = None) -> None:
        """``metrics``: served on ``/metrics`` as built (the ledger's totals are there when its
        builder gave it the ledger, :class:`ExtenderMetrics`). ``requests``: the watch's memo of
        translated pods (``ClusterCache.requests``), so a pod's filter reuses what its watch event
        translated; None keeps a memo of the API's own. ``claim_pods``: with the claim watch, a
        pod's pending DRA claims join its request in filter and prioritize, so gpupool chooses the
        node of claim pods too (docs/dra.md, "Choosing between the extender path and the DRA path")."""
        if requests is not None and requests.names != names:
            raise ValueError("the request memo translates with other resource names than the API's")
        self.service = service
        self.bodies = BodyReader(max_body_bytes)
        self.names = names
        self.tenancy_names = TenancyNames(names.domain)
        self.metrics = metrics
        self.pool = ThreadPoolExecutor(max_workers=bind_workers, thread_name_prefix="gpupool-bind")
        # one thread: concurrent scrapes queue instead of rendering side by side
        self.scrapes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpupool-metrics")
        self.priorities = HostPriorityEncoder()
        self.records = RecordsForLayout(service.row_names)
        self.requests = requests if requests is not None else RequestMemo(names)
        """Translated requests: the pod's filter call reuses what its watch event translated."""
        self.claim_pods = claim_pods

    # ----------------------------------------------------------------------------------- verbs
    def _pod_request(self, pod: dict[str, Any]) -> PodRequest:
        """The pod's request; :class:`TranslationError` for a pod gpupool refuses, :class:`WireError`
        (400) for a value the apiserver itself would have refused (``inf``, a 3,000-digit quantity)."""
        try:
            return self.requests.request(pod)
        except InvalidObjectError as exc:
            raise WireError(str(exc)) from None

    def _placed_request(self, pod: dict[str, Any]) -> PodRequest:
        """What filter and prioritize place: the pod's request and its pending claims' asks of
        gpupool's cards (preempt reads the same, :meth:`_preempted_request`)."""
        request = self._pod_request(pod)
        return request if self.claim_pods is None else self.claim_pods.request(pod, request)

    def _preempted_request(self, pod: dict[str, Any]) -> tuple[PodRequest, tuple[str, ...]]:
        """What preempt makes room for: :meth:`_placed_request`, and the keys of the pod's claims
        allocated already (the victims free the cards their allocations hold)."""
        request = self._pod_request(pod)
        if self.claim_pods is None:
            return request, ()
        reading = self.claim_pods.read(pod, request)
        return reading.request, reading.allocated

    def _tenant(self, pod: dict[str, Any]) -> PodTenancy:
        """The pod's group, namespace and card controls; :class:`TranslationError` for a broken one."""
        return pod_tenancy(pod, self.tenancy_names)

    def _not_binding_here(self) -> str:
        """Why a pod scheduled through this replica would have its bind refused ("" when it would not).

        Under leader election only the leader, once its term caught up, binds; the Service routes
        kube-scheduler to it by its label, so a follower is called only through a stale route (a
        label the previous leader could not take off, a kept-alive connection from when it led).
        A cache that has not synced is left to the verbs' own answer (``NOT_SYNCED``).
        """
        if self.service.binder is None or not self.service.cache.synced:
            return ""
        return self.service.unready()

    async def _filter(self, doc: Any) -> tuple[Any, str]:
        args = parse_extender_args(doc)
        refusal = self._not_binding_here()
        if refusal:  # the pod would pass here and have its bind refused: say so now, retryably
            return FilterResult(error=not_binding_error(refusal)).to_json(args), NOT_LEADER
        try:
            request = self._placed_request(args.pod)
            tenant = self._tenant(args.pod)
        except TranslationError as exc:
            return FilterResult(error=str(exc)).to_json(args), "invalid_pod"
        aliases = foreign_resources(args.pod)
        reasons = not self.service.settings.filter_best_only
        outcome = self.service.filter(request, args.node_names, aliases, tenant, reasons_if_passed=reasons,
                                      pod=args.pod)
        label = "error" if outcome.error else "ok"
        failed = outcome.failed if self._reasons_needed(outcome.passed) else {}
        if args.node_cache_capable:
            passed = self.records.name_list(outcome.passed, outcome.rows, outcome.layout)
            if passed is not None:  # the same document FilterResult.to_json gives, written faster
                failed_json = orjson.dumps(failed)
                if b"%" in failed_json:  # one scan of the bytes; kube-scheduler would take it for a verb
                    failed_json = orjson.dumps(format_safe_reasons(failed))
                return RawJson(b'{"Nodes":null,"NodeNames":' + passed + b',"FailedNodes":'
                               + failed_json + b',"Error":'
                               + orjson.dumps(format_safe(outcome.error)) + b"}"), label
        result = FilterResult(passed=outcome.passed, failed=failed, error=outcome.error)
        return result.to_json(args), label

    def _reasons_needed(self, passed: list[str]) -> bool:
        """Does the filter answer carry ``FailedNodes``? Always, except with ``--filter-best-only``
        when some node passed. kube-scheduler v1.20 reads the reasons only when *no* node passed
        every filter and extender (``genericScheduler.Schedule`` puts them into the ``FitError``
        that the pod's event and preemption read); when one passed it only counts them for a log
        line. Best only leaves ~1,000 feasible nodes out per call with a "fits, but" reason, a map
        kube-scheduler decoded per pod for nothing (docs/extender.md, "End-to-end throughput")."""
        return not passed or not self.service.settings.filter_best_only

    async def _prioritize(self, doc: Any) -> tuple[Any, str]:
        args: ExtenderArgs = parse_extender_args(doc)
        try:
            request = self._placed_request(args.pod)
            tenant = self._tenant(args.pod)
        except TranslationError as exc:
            # HostPriorityList has no Error field: score every node 0 and log the reason.
            log.warning("prioritize: %s", exc)
            return RawJson(self.priorities.encode(dict.fromkeys(args.node_names, 0))), "invalid_pod"
        scores, error = self.service.prioritize(request, args.node_names, foreign_resources(args.pod), tenant)
        if error:
            log.warning("prioritize: %s", error)
            scores = NodeScores.uniform(args.node_names)
        body = self.records.priority_list(scores)
        if body is None:
            body = self.priorities.encode_lists(scores.hosts, scores.scores)
        if self._not_binding_here():  # scores are harmless; the connection is closed (_endpoint)
            return RawJson(body), NOT_LEADER
        return RawJson(body), "error" if error else "ok"

    async def _bind(self, doc: Any) -> tuple[Any, str]:
        args = parse_binding_args(doc)
        refused = self.service.refuse_bind(args.pod_namespace, args.pod_name)
        if refused is not None:  # answered here, not behind binds still waiting on the bind threads
            log.info("bind %s/%s → %s refused: %s", args.pod_namespace, args.pod_name, args.node, refused.error)
            return binding_result(refused.error), NOT_LEADER
        loop = asyncio.get_running_loop()
        with self.metrics.binds_in_flight.track_inprogress():
            result = await loop.run_in_executor(self.pool, self.service.bind, args.pod_namespace,
                                                args.pod_name, args.pod_uid, args.node)
        if result.attempts > 1:
            self.metrics.bind_attempts.inc(result.attempts - 1)
        if result.error:
            log.info("bind %s/%s → %s refused: %s", args.pod_namespace, args.pod_name, args.node,
                     result.error)
            if self._not_binding_here():
                return binding_result(result.error), NOT_LEADER
        return binding_result(result.error), "error" if result.error else "ok"

    async def _preempt(self, doc: Any) -> tuple[Any, str]:
        args = parse_preemption_args(doc)
        try:
            request, own_claims = self._preempted_request(args.pod)
            tenant = self._tenant(args.pod)
        except TranslationError as exc:
            log.warning("preempt: %s", exc)
            return preemption_result({}, {}), "invalid_pod"
        kept, error = self.service.preempt(request, args.victims, tenant, own_claims)
        if error:
            log.warning("preempt: %s", error)
        return preemption_result(kept, args.pdb_violations), "error" if error else "ok"

    # ------------------------------------------------------------------------------- plumbing
    def _endpoint(self, verb: str, handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def endpoint(request: web.Request) -> web.Response:
            started = time.perf_counter()
            status = 200
            headers: dict[str, str] = {}
            try:
                async with self.bodies.body(request) as raw:
                    try:
                        doc = load_json_body(raw)
                    except UnreadableJsonError as exc:
                        raise WireError(str(exc)) from None
                    body, outcome = await handler(doc)
            except WireError as exc:
                status, outcome = 400, "bad_request"
                body = {"Error": f"bad {verb} request: {exc}"}
            except BodyTooLargeError as exc:
                status, outcome = 413, "too_large"
                body = {"Error": f"bad {verb} request: {exc}"}
            except BodiesBusyError as exc:
                status, outcome, headers = 503, "busy", {"Retry-After": "1"}
                body = {"Error": f"gpupool extender busy in {verb}: {exc}"}
            except Exception as exc:  # never let one request take the server down
                log.exception("%s failed", verb)
                status, outcome = 500, "internal_error"
                body = {"Error": f"gpupool extender internal error in {verb}: {type(exc).__name__}: {exc}"}
            self.metrics.observe(verb, outcome, time.perf_counter() - started)
            data = body.data if isinstance(body, RawJson) else orjson.dumps(body)
            response = web.Response(status=status, body=data, content_type="application/json", charset="utf-8",
                                    headers=headers)
            if status in (413, 503):
                response.force_close()  # do not read (or linger over) the rest of a refused body
            elif outcome == NOT_LEADER:
                # kube-scheduler keeps its connections open, and kube-proxy routes a connection,
                # not a request: closed, the next call connects through the Service to the leader
                response.force_close()
            return response

        return endpoint

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, request: web.Request) -> web.Response:
        """200 only where kube-scheduler's calls should go: synced and, under leader election, the
        leader with its ledger caught up (``ExtenderService.unready``); 503 with the reason else."""
        reason = self.service.unready()
        if not reason:
            return web.Response(text="ok")
        return web.Response(status=503, text=reason)

    async def _syncz(self, request: web.Request) -> web.Response:
        """200 once this replica's cache has synced, leader or not: the Deployment's readiness, so a
        rolling update can bring synced followers up (kube-scheduler's Service selects the leader by
        its label, :mod:`gpupool.extender.leader_label`); 503 before."""
        if self.service.cache.synced:
            return web.Response(text="ok")
        return web.Response(status=503, text="cache not synced")

    async def _metrics(self, request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(self.scrapes, generate_latest, self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def app(self, prefix: str = "") -> web.Application:
        """The aiohttp application; verbs are served under ``prefix`` (kube-scheduler's urlPrefix path)."""
        prefix = prefix.rstrip("/")
        application = web.Application(client_max_size=self.bodies.max_body_bytes)
        application[SERVICE_KEY] = self.service
        application[METRICS_KEY] = self.metrics
        handlers: dict[str, Handler] = {"filter": self._filter, "prioritize": self._prioritize,
                                        "bind": self._bind, "preempt": self._preempt}
        for verb, handler in handlers.items():
            application.router.add_post(f"{prefix}/{verb}", self._endpoint(verb, handler))
        self._add_probes(application)
        application.on_cleanup.append(self._shutdown)
        return application

    def probe_app(self) -> web.Application:
        """``/healthz``, ``/readyz`` and ``/metrics`` only, no verb: what the plain-HTTP health port
        serves beside the verbs' mutual-TLS port, for kubelet's probes and Prometheus, which present
        no client certificate (docs/security.md)."""
        application = web.Application(client_max_size=1024)
        self._add_probes(application)
        return application

    def _add_probes(self, application: web.Application) -> None:
        application.router.add_get("/healthz", self._healthz)
        application.router.add_get("/readyz", self._readyz)
        application.router.add_get("/syncz", self._syncz)
        application.router.add_get("/metrics", self._metrics)

    async def _shutdown(self, _: web.Application) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.scrapes.shutdown(wait=False, cancel_futures=True)
