"""The validating admission webhook's HTTP side: ``POST /admission/pods`` answers an
``AdmissionReview`` (``admission.k8s.io/v1``, or ``v1beta1``, which a v1.20 apiserver may send per
the configuration's ``admissionReviewVersions``) with the verdict of
:class:`gpupool.extender.admission.QuotaAdmission`.

Why a port of its own (``--admission-port``), served by the extender process rather than a separate
command: the verdict needs the extender's caches (quotas, the ledger's GPU models), which a second
process would have to list and watch again. The verbs' port wants a client certificate from the
scheduler's CA, which the apiserver does not present unless every apiserver is given an admission
kubeconfig; this port serves the same certificate (reloaded the same way) without asking for one,
and only this path: whoever reaches it learns a quota's reason for a pod they could create anyway.

The answer echoes the request's ``apiVersion`` and ``uid`` (the apiserver checks both). A body that
is no AdmissionReview gets a 400 with the reason (the apiserver then applies the webhook's
``failurePolicy``); a bug a 500; nothing crashes the server. Requests other than a pod's CREATE are
allowed untouched (the configuration should not send them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from gpupool.extender.admission import ALLOWED, QuotaAdmission, Verdict
from gpupool.extender.http.body import BodiesBusyError, BodyReader, BodyTooLargeError
from gpupool.extender.metrics import ExtenderMetrics

log = logging.getLogger(__name__)

ADMISSION_PATH = "/admission/pods"
REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
DENIED_CODE = 403
"""What the apiserver returns for a denied request: Forbidden, as for a ResourceQuota exceeded."""
VERB = "admission"


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


def _field(obj: Mapping[str, Any], key: str, kind: type, where: str, required: bool = True) -> Any:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, kind):
        raise ReviewError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


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
        pod = {**pod, "metadata": {**metadata, "name": metadata.get("name") or request.get("name") or "(generated)",
                                   "namespace": request.get("namespace") or metadata.get("namespace")}}
    return Review(version, uid, str(request.get("operation") or ""), str(kind.get("kind") or ""),
                  str(request.get("namespace") or ""), pod)


def review_response(review: Review, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview answering ``review`` (same apiVersion and uid)."""
    response: dict[str, Any] = {"uid": review.uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": DENIED_CODE, "reason": "Forbidden", "message": verdict.reason}
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": response}


class AdmissionApi:
    """``POST /admission/pods`` over a :class:`QuotaAdmission`, with the extender's body caps."""

    def __init__(self, admission: QuotaAdmission, metrics: ExtenderMetrics, bodies: BodyReader) -> None:
        self.admission = admission
        self.metrics = metrics
        self.bodies = bodies

    def verdict(self, review: Review) -> Verdict:
        if review.operation != "CREATE" or review.kind != "Pod" or review.pod is None:
            return ALLOWED
        return self.admission.review(review.pod, review.namespace)

    async def handle(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        status, outcome = 200, "ok"
        try:
            async with self.bodies.body(request) as raw:
                try:
                    review = parse_review(orjson.loads(raw))
                except orjson.JSONDecodeError as exc:
                    raise ReviewError(f"malformed JSON: {exc}") from None
                verdict = self.verdict(review)
            body: dict[str, Any] = review_response(review, verdict)
            if not verdict.allowed:
                outcome = "denied"
                log.info("admission: denied pod creation in %s: %s", review.namespace, verdict.reason)
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
        self.metrics.observe(VERB, outcome, time.perf_counter() - started)
        return web.Response(status=status, body=orjson.dumps(body), content_type="application/json",
                            charset="utf-8")

    def app(self) -> web.Application:
        """The webhook's application: this path only."""
        application = web.Application(client_max_size=self.bodies.max_body_bytes)
        application.router.add_post(ADMISSION_PATH, self.handle)
        return application
