"""The three pod calls a bind needs, behind a small interface, with typed errors.

Why an interface: the conflict-safety of binding is proven in unit tests against
:class:`gpupool.testing.fake_api.FakePodApi` (which returns 409 exactly as the apiserver does),
and the benchmark can run against it when no apiserver is available. :class:`KubePodApi` is the
real implementation over the official client; it reads raw JSON (``_preload_content=False``)
because deserialising into client models is slow and the translation works on dicts anyway.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol
from urllib.parse import quote

import orjson

EVENT_SOURCE = "gpupool-extender"
"""``source.component`` of the Events gpupool writes (what ``kubectl describe`` shows as From)."""


class ApiError(RuntimeError):
    """A call to the API failed; ``status`` is the HTTP status (0 when no response came)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class ConflictError(ApiError):
    """409: the object changed since it was read (or the pod is already bound)."""


class NotFoundError(ApiError):
    """404: the object does not exist (any more)."""


class NoAnswerError(ApiError):
    """No HTTP answer (timeout, connection reset): a write may or may not have been applied."""


MAY_HAVE_APPLIED_STATUSES = frozenset({500, 502, 504})
"""Server errors after which a write may still have been applied: 500 (etcd's "request timed out"
or "leader changed" come after the write was proposed, and it may commit), 502 and 504 (a proxy or
the apiserver's own timeout filter gave up on a request the apiserver may still be processing:
"may still be processing the request", its 504 says). 4xx answers and 503 (not processed: the
apiserver unavailable or shutting down) are refusals."""


def may_have_applied(exc: ApiError) -> bool:
    """Whether the write that failed with ``exc`` may still have been applied (no answer at all, or
    one of :data:`MAY_HAVE_APPLIED_STATUSES`).

    Why it matters: a bind that rolled its reservation back after such a write freed cards that the
    pod may hold in the API, and the next bind gave them away a second time."""
    return isinstance(exc, NoAnswerError) or exc.status == 0 or exc.status in MAY_HAVE_APPLIED_STATUSES


class PodApi(Protocol):
    """What the binder asks of the API."""

    def get_pod(self, namespace: str, name: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """The pod as JSON (fresh from the API, with its current resourceVersion).

        ``timeout_s`` bounds this read when the caller has less time left than the client's own
        request timeout (a bind answers within its deadline even when the apiserver stalls)."""

    def patch_pod_annotations(self, namespace: str, name: str, resource_version: str,
                              annotations: dict[str, str | None]) -> dict[str, Any]:
        """Merge ``annotations`` (None deletes one) if the pod is still at ``resource_version``.

        Raises :class:`ConflictError` when it is not: this precondition is the optimistic
        concurrency that stops two writers from both believing they annotated the same version.
        """

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, *,
                 annotations: Mapping[str, str] | None = None, resource_version: str = "") -> None:
        """POST the Binding; :class:`ConflictError` if the pod is already bound or was replaced.

        ``annotations`` travel in the Binding's own metadata: the apiserver merges them into the
        pod in the same write that sets its node (``setPodHostAndAnnotations``), so a pod is never
        bound without them, nor annotated without being bound. ``uid`` and ``resource_version``
        are sent as preconditions; apiservers from v1.23 honour both (409 when the pod was
        replaced or changed), v1.20-v1.22 ignore them and refuse only an already bound pod.
        """

    def create_pod_event(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        """Record a Warning Event about the pod (``kubectl describe pod`` shows it)."""


def _raise_for(exc: Exception, what: str) -> ApiError:
    return _status_error(int(getattr(exc, "status", 0) or 0), getattr(exc, "body", None), what)


def _status_error(status: int, body: Any, what: str) -> ApiError:
    detail = ""
    if body:
        try:
            detail = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            detail = str(body)[:200]
    message = f"{what}: HTTP {status} {detail}".strip()
    if status == 409:
        return ConflictError(message, status)
    if status == 404:
        return NotFoundError(message, status)
    return ApiError(message, status)


def pod_event(namespace: str, name: str, uid: str, reason: str, message: str,
              now: dt.datetime | None = None) -> dict[str, Any]:
    """A core/v1 Warning Event about a pod, as JSON (the name is generated by the apiserver)."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name}
    if uid:
        involved["uid"] = uid
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": involved, "reason": reason, "message": message, "type": "Warning",
            "source": {"component": EVENT_SOURCE}, "firstTimestamp": stamp, "lastTimestamp": stamp,
            "count": 1}


def binding_body(namespace: str, name: str, uid: str, node: str,
                 annotations: Mapping[str, str] | None = None, resource_version: str = "") -> dict[str, Any]:
    """A core/v1 Binding as JSON: the pod (with its uid and version as preconditions), the node and
    the annotations the apiserver merges into the pod as it binds it."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if resource_version:
        meta["resourceVersion"] = resource_version
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


def _no_answer(exc: Exception, what: str) -> NoAnswerError:
    return NoAnswerError(f"{what}: no answer: {type(exc).__name__}: {exc}")


class KubePodApi:
    """:class:`PodApi` over ``kubernetes.client.CoreV1Api``.

    ``patch_timeout_s`` bounds the assignment write separately (the PATCH, or the Binding that
    carries the assignment): a leader's write must be over before another replica may take the
    Lease (:attr:`LeaseSettings.commit_timeout_s`), so it gets a shorter timeout than the reads and
    a Binding without annotations.
    """

    def __init__(self, core_v1: Any, request_timeout_s: float = 10.0,
                 patch_timeout_s: float | None = None) -> None:
        self.core = core_v1
        self.timeout = request_timeout_s
        self.patch_timeout = request_timeout_s if patch_timeout_s is None else patch_timeout_s

    @staticmethod
    def _call(what: str, call: Callable[[], Any]) -> Any:
        """Run one API call, turning its failures into this module's errors (raw response back)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call()
        except ApiException as exc:
            raise _raise_for(exc, what) from None
        except (HTTPError, OSError) as exc:
            raise _no_answer(exc, what) from None

    def get_pod(self, namespace: str, name: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        timeout = self.timeout if timeout_s is None else min(self.timeout, timeout_s)
        resp = self._call(f"GET pod {namespace}/{name}", lambda: self.core.read_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=timeout))
        result: dict[str, Any] = json.loads(resp.data)
        return result

    def patch_pod_annotations(self, namespace: str, name: str, resource_version: str,
                              annotations: dict[str, str | None]) -> dict[str, Any]:
        body = {"metadata": {"resourceVersion": resource_version, "annotations": annotations}}
        resp = self._call(f"PATCH pod {namespace}/{name}", lambda: self.core.patch_namespaced_pod(
            name, namespace, body, _preload_content=False, _content_type="application/merge-patch+json",
            _request_timeout=self.patch_timeout))
        result: dict[str, Any] = json.loads(resp.data)
        return result

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, *,
                 annotations: Mapping[str, str] | None = None, resource_version: str = "") -> None:
        body = binding_body(namespace, name, uid, node, annotations, resource_version)
        # A Binding that carries the assignment is the assignment write: it gets the commit timeout.
        timeout = self.patch_timeout if annotations else self.timeout
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/binding"
        self._post(f"POST binding {namespace}/{name} → {node}", path, body, timeout)

    def _post(self, what: str, path: str, body: dict[str, Any], timeout: float) -> None:
        """POST ``body`` as JSON through the client's own connection pool (its TLS, client
        certificate, proxy) with its current credentials (``auth_settings`` runs the token refresh
        hook, as the generated methods do), and read the answer (urllib3 returns a connection to
        its pool only then; unread, the next call would pay a new TCP + TLS handshake).

        Why not the generated method: one Binding through it costs about twice the CPU (argument
        validation, parameter serialisation, header selection), on the path every bind takes
        (docs/extender.md, "End-to-end throughput"). The request is the same."""
        from urllib3 import Timeout
        from urllib3.exceptions import HTTPError

        api_client = self.core.api_client
        configuration = api_client.configuration
        headers = {**api_client.default_headers, "Content-Type": "application/json", "Accept": "application/json"}
        for auth in configuration.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        try:
            resp = api_client.rest_client.pool_manager.urlopen(
                "POST", configuration.host + path, body=orjson.dumps(body), headers=headers,
                timeout=Timeout(total=timeout), retries=False, redirect=False, preload_content=True)
        except (HTTPError, OSError) as exc:
            raise _no_answer(exc, what) from None
        if not 200 <= resp.status < 300:
            raise _status_error(resp.status, resp.data, what)

    def create_pod_event(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        body = pod_event(namespace, name, uid, reason, message)
        resp = self._call(f"POST event about pod {namespace}/{name}", lambda: self.core.create_namespaced_event(
            namespace, body, _preload_content=False, _request_timeout=self.timeout))
        resp.data  # noqa: B018 - read for its side effect (the connection goes back to the pool)
