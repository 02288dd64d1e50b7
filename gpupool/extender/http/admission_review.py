"""The admission webhooks' HTTP side: each path answers an ``AdmissionReview``
(``admission.k8s.io/v1``, or ``v1beta1``, which an older apiserver may send per the configuration's
``admissionReviewVersions``) with one verdict:

* ``POST /admission/pods``: a new pod gpupool can never place (an unreadable request, or cards no
  node has: :class:`gpupool.extender.request_admission.RequestAdmission`), then under its
  namespace's GPU quotas (:class:`gpupool.extender.admission.QuotaAdmission`);
* ``POST /admission/pod-groups``: a pod naming a resource group, by the group's subjects and the
  requester (:class:`gpupool.extender.group_subjects.GroupSubjectAdmission`);
* ``POST /admission/resourcegroups``: a ResourceGroup write, by the requester's permission to
  modify the nodes it names (:class:`gpupool.extender.group_writes.GroupWriteAdmission`; its
  SubjectAccessReviews run off the event loop);
* ``POST /admission/pod-scheduler`` (mutating): a new pod that asks for gpupool's resources has
  the memory sizes it wrote where a resource counts units rewritten to counts, is refused when
  gpupool can never place it (:class:`gpupool.extender.request_admission.RequestAdmission`), and
  gets ``spec.schedulerName`` of gpupool's own scheduler
  (:class:`gpupool.extender.scheduler_steering.SchedulerSteering`) and, for a remote share, the GPU
  client and its grant (:class:`gpupool.extender.remote_injection.RemoteInjection`), as one JSON patch;
* ``POST /admission/claim-groups`` (mutating): a new ResourceClaim gets the CEL selectors that keep
  its requests of gpupool's classes on the cards its resource groups allow, or is refused
  (:class:`gpupool.extender.claim_group_admission.ClaimGroupAdmission`).

Why a port of its own (``--admission-port``), served by the extender process rather than a separate
command: the verdict needs the extender's caches (quotas, the ledger's GPU models), which a second
process would have to list and watch again. The verbs' port wants a client certificate from the
scheduler's CA, which the apiserver does not present unless every apiserver is given an admission
kubeconfig; this port serves the same certificate (reloaded the same way) without asking for one,
and only these paths: whoever reaches them learns a quota's reason for a pod they could create
anyway, whether a user may use a group, or whether a user may modify some nodes.

The answer echoes the request's ``apiVersion`` and ``uid`` (the apiserver checks both). A body that
is no AdmissionReview gets a 400 with the reason (the apiserver then applies the webhook's
``failurePolicy``); a bug a 500; nothing crashes the server. Requests a path does not judge (another
kind or operation) are allowed untouched (the configuration should not send them).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from gpupool.extender.admission import ALLOWED, QuotaAdmission, Verdict
from gpupool.extender.claim_group_admission import ClaimGroupAdmission
from gpupool.extender.group_subjects import GroupSubjectAdmission
from gpupool.extender.group_writes import GroupWriteAdmission
from gpupool.extender.http.body import (
    BodiesBusyError,
    BodyReader,
    BodyTooLargeError,
    UnreadableJsonError,
    load_json_body,
)
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.remote_injection import RemoteInjection
from gpupool.extender.request_admission import RequestAdmission
from gpupool.extender.scheduler_steering import SchedulerSteering

log = logging.getLogger(__name__)

ADMISSION_PATH = "/admission/pods"
POD_GROUPS_PATH = "/admission/pod-groups"
GROUP_WRITES_PATH = "/admission/resourcegroups"
POD_SCHEDULER_PATH = "/admission/pod-scheduler"
CLAIM_GROUPS_PATH = "/admission/claim-groups"
REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
DENIED_CODE = 403
"""What the apiserver returns for a denied request: Forbidden, as for a ResourceQuota exceeded."""
VERB = "admission"
POD_GROUPS_VERB = "admission_pod_groups"
GROUP_WRITES_VERB = "admission_resourcegroups"
POD_SCHEDULER_VERB = "admission_pod_scheduler"
CLAIM_GROUPS_VERB = "admission_claim_groups"


class ReviewError(ValueError):
    """The body is not an AdmissionReview this webhook can answer (a 400)."""


@dataclass(frozen=True)
class Review:
    """The parts of an AdmissionReview request the verdict needs."""

    api_version: str
    uid: str
    operation: str
    kind: str
    namespace: str
    pod: Mapping[str, Any] | None
    """The request's object (a pod on the pods' paths), None on a delete."""
    old: Mapping[str, Any] | None = None
    """The stored object of an update or delete."""
    user: str = ""
    """The requester (``userInfo.username``)."""
    groups: tuple[str, ...] = ()
    """The requester's groups (``userInfo.groups``)."""


def _field(obj: Mapping[str, Any], key: str, kind: type, where: str, required: bool = True) -> Any:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, kind):
        raise ReviewError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


GENERATED = "(generated)"
"""The name :func:`parse_review` gives a pod the apiserver names after admission (``generateName``);
never a valid name."""


def unnamed(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """``pod`` without the name :func:`parse_review` made up for it, as the apiserver sent it."""
    meta = pod.get("metadata") or {}
    if meta.get("name") != GENERATED:
        return pod
    return {**pod, "metadata": {k: v for k, v in meta.items() if k != "name"}}


def parse_review(doc: Any) -> Review:
    """The request of an AdmissionReview document; :class:`ReviewError` names what is wrong."""
    if not isinstance(doc, dict):
        raise ReviewError(f"expected an AdmissionReview object, got {type(doc).__name__}")
    version = _field(doc, "apiVersion", str, "AdmissionReview")
    if version not in REVIEW_VERSIONS:
        raise ReviewError(f"AdmissionReview.apiVersion: {version[:64]!r} is not one of {', '.join(REVIEW_VERSIONS)}")
    if doc.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind: expected AdmissionReview, got {str(doc.get('kind'))[:64]!r}")
    request = _field(doc, "request", dict, "AdmissionReview")
    uid = _field(request, "uid", str, "request")
    if not uid:
        raise ReviewError("request.uid: empty")
    kind = _field(request, "kind", dict, "request")
    pod = _field(request, "object", dict, "request", required=False)
    if pod is not None:
        metadata = _field(pod, "metadata", dict, "request.object", required=False) or {}
        # the body of a pod created without these carries none; the request's are the truth
        pod = {**pod, "metadata": {**metadata, "name": metadata.get("name") or request.get("name") or GENERATED,
                                   "namespace": request.get("namespace") or metadata.get("namespace")}}
    old = _field(request, "oldObject", dict, "request", required=False)
    user_info = _field(request, "userInfo", dict, "request", required=False) or {}
    user = _field(user_info, "username", str, "request.userInfo", required=False) or ""
    groups = _field(user_info, "groups", list, "request.userInfo", required=False) or []
    if not all(isinstance(g, str) for g in groups):
        raise ReviewError("request.userInfo.groups: expected a list of strings")
    return Review(version, uid, str(request.get("operation") or ""), str(kind.get("kind") or ""),
                  str(request.get("namespace") or ""), pod, old, user, tuple(groups))


def review_response(review: Review, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview answering ``review`` (same apiVersion and uid)."""
    response: dict[str, Any] = {"uid": review.uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": DENIED_CODE, "reason": "Forbidden", "message": verdict.reason}
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    if verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(list(verdict.patch))).decode("ascii")
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": response}


Judge = Callable[[Review], Verdict]


class AdmissionApi:
    """The webhooks' paths over their verdicts, with the extender's body caps: the quota's always,
    the pod-group, ResourceGroup-write and pod-scheduler ones when given. ``requests`` judges what
    new pods ask for on both pod paths (default: against the quota admission's ledger)."""

    def __init__(self, admission: QuotaAdmission, metrics: ExtenderMetrics, bodies: BodyReader, *,
                 pod_groups: GroupSubjectAdmission | None = None,
                 group_writes: GroupWriteAdmission | None = None,
                 steering: SchedulerSteering | None = None,
                 requests: RequestAdmission | None = None,
                 remote_injection: RemoteInjection | None = None,
                 claim_groups: ClaimGroupAdmission | None = None) -> None:
        self.admission = admission
        self.requests = requests or RequestAdmission(admission.ledger, admission.names)
        self.metrics = metrics
        self.bodies = bodies
        self.pod_groups = pod_groups
        self.group_writes = group_writes
        self.steering = steering
        self.remote_injection = remote_injection
        """With the steering: the GPU client and its grant added to a remote-share pod."""
        self.claim_groups = claim_groups
        """New ResourceClaims kept to their resource groups' cards."""

    def verdict(self, review: Review) -> Verdict:
        """The verdict on a pod's creation: its request as it will be stored, then its quotas."""
        if review.operation != "CREATE" or review.kind != "Pod" or review.pod is None:
            return ALLOWED
        checked = self.requests.review(review.pod, rewrite=False)
        return checked if not checked.allowed else self.admission.review(review.pod, review.namespace)

    def pod_group_verdict(self, review: Review) -> Verdict:
        """The group subjects' verdict on a pod's creation or relabelling."""
        if self.pod_groups is None or review.kind != "Pod" or review.pod is None \
                or review.operation not in ("CREATE", "UPDATE"):
            return ALLOWED
        old = review.old if review.operation == "UPDATE" else None
        return self.pod_groups.review(review.pod, old, review.namespace, review.user, review.groups)

    def group_write_verdict(self, review: Review) -> Verdict:
        """The requester's permission to write a ResourceGroup (blocking: API calls)."""
        if self.group_writes is None or review.kind != "ResourceGroup":
            return ALLOWED
        return self.group_writes.review(review.operation, review.pod, review.old, review.user, review.groups)

    def pod_scheduler_verdict(self, review: Review) -> Verdict:
        """What a new pod asks for (sizes rewritten to counts, or refused) and the scheduler it goes
        to: one patch for both."""
        if self.steering is None or review.operation != "CREATE" or review.kind != "Pod" or review.pod is None:
            return ALLOWED
        checked = self.requests.review(review.pod)
        if not checked.allowed:
            return checked
        verdict = self.steering.verdict(review.pod, review.namespace or None)
        if self.remote_injection is not None:
            injected = self.remote_injection.verdict(unnamed(review.pod))
            if not injected.allowed:
                return injected
            verdict = Verdict(True, warnings=verdict.warnings + injected.warnings,
                              patch=verdict.patch + injected.patch)
        if verdict.patch:
            log.debug("%s: pod %s/%s goes to %s", POD_SCHEDULER_VERB, review.namespace,
                      review.pod["metadata"]["name"], self.steering.scheduler_name)
        if not checked.patch and not checked.warnings:
            return verdict
        return Verdict(True, warnings=checked.warnings + verdict.warnings, patch=checked.patch + verdict.patch)

    def claim_group_verdict(self, review: Review) -> Verdict:
        """The selectors that keep a new claim on its resource groups' cards (or its refusal)."""
        if self.claim_groups is None or review.operation != "CREATE" or review.kind != "ResourceClaim" \
                or review.pod is None:
            return ALLOWED
        return self.claim_groups.review(review.pod, review.namespace)

    def handler(self, verb: str, judge: Judge, blocking: bool = False) -> Callable[[web.Request], Any]:
        """The request handler of one path: parse, judge (in a thread when ``blocking``), answer."""

        async def handle(request: web.Request) -> web.Response:
            return await self.handle(request, verb, judge, blocking)

        return handle

    async def handle(self, request: web.Request, verb: str = VERB, judge: Judge | None = None,
                     blocking: bool = False) -> web.Response:
        started = time.perf_counter()
        status, outcome = 200, "ok"
        judge = judge or self.verdict
        try:
            async with self.bodies.body(request) as raw:
                try:
                    review = parse_review(load_json_body(raw))
                except UnreadableJsonError as exc:
                    raise ReviewError(str(exc)) from None
            verdict = await asyncio.to_thread(judge, review) if blocking else judge(review)
            body: dict[str, Any] = review_response(review, verdict)
            if not verdict.allowed:
                outcome = "denied"
                log.info("%s: denied %s %s in %s for %s: %s", verb, review.operation, review.kind,
                         review.namespace or "(cluster)", review.user or "(unknown)", verdict.reason)
        except ReviewError as exc:
            status, outcome, body = 400, "bad_request", {"Error": f"bad admission request: {exc}"}
        except BodyTooLargeError as exc:
            status, outcome, body = 413, "too_large", {"Error": f"bad admission request: {exc}"}
        except BodiesBusyError as exc:
            status, outcome, body = 503, "busy", {"Error": f"gpupool extender busy in admission: {exc}"}
        except Exception as exc:  # never let one request take the server down
            log.exception("admission failed")
            status, outcome = 500, "internal_error"
            body = {"Error": f"gpupool admission internal error: {type(exc).__name__}: {exc}"}
        self.metrics.observe(verb, outcome, time.perf_counter() - started)
        return web.Response(status=status, body=orjson.dumps(body), content_type="application/json",
                            charset="utf-8")

    def app(self) -> web.Application:
        """The webhooks' application: these paths only."""
        application = web.Application(client_max_size=self.bodies.max_body_bytes)
        application.router.add_post(ADMISSION_PATH, self.handler(VERB, self.verdict))
        if self.pod_groups is not None:
            # a refusal is confirmed by an API read (bounded): off the event loop then
            application.router.add_post(POD_GROUPS_PATH, self.handler(
                POD_GROUPS_VERB, self.pod_group_verdict, blocking=self.pod_groups.blocking))
        if self.group_writes is not None:
            application.router.add_post(GROUP_WRITES_PATH,
                                        self.handler(GROUP_WRITES_VERB, self.group_write_verdict, blocking=True))
        if self.steering is not None:
            # claim steering may read a claim from the API (bounded): off the event loop then
            application.router.add_post(POD_SCHEDULER_PATH, self.handler(
                POD_SCHEDULER_VERB, self.pod_scheduler_verdict, blocking=self.steering.claims is not None))
        if self.claim_groups is not None:
            application.router.add_post(CLAIM_GROUPS_PATH, self.handler(CLAIM_GROUPS_VERB, self.claim_group_verdict))
        return application
