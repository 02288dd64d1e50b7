"""The three pod calls a bind needs, behind a small interface, with typed errors.

Why an interface: the conflict-safety of binding is proven in unit tests against
:class:`gpupool.testing.fake_api.FakePodApi` (which returns 409 exactly as the apiserver does),
and the benchmark can run against it when no apiserver is available. :class:`KubePodApi` is the
real implementation over the official client; it reads raw JSON (``_preload_content=False``)
because deserialising into client models is slow and the translation works on dicts anyway.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol


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


class PodApi(Protocol):
    """What the binder asks of the API."""

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """The pod as JSON (fresh from the API, with its current resourceVersion)."""

    def patch_pod_annotations(self, namespace: str, name: str, resource_version: str,
                              annotations: dict[str, str | None]) -> dict[str, Any]:
        """Merge ``annotations`` (None deletes one) if the pod is still at ``resource_version``.

        Raises :class:`ConflictError` when it is not: this precondition is the optimistic
        concurrency that stops two writers from both believing they annotated the same version.
        """

    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        """POST the Binding; :class:`ConflictError` if the pod is already bound or was replaced."""


def _raise_for(exc: Exception, what: str) -> ApiError:
    status = int(getattr(exc, "status", 0) or 0)
    body = getattr(exc, "body", None)
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


def _no_answer(exc: Exception, what: str) -> NoAnswerError:
    return NoAnswerError(f"{what}: no answer: {type(exc).__name__}: {exc}")


class KubePodApi:
    """:class:`PodApi` over ``kubernetes.client.CoreV1Api``.

    ``patch_timeout_s`` bounds the assignment write separately: a leader's write must be over
    before another replica may take the Lease (:attr:`LeaseSettings.commit_timeout_s`), so it gets
    a shorter timeout than the reads and the Binding.
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

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        resp = self._call(f"GET pod {namespace}/{name}", lambda: self.core.read_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=self.timeout))
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

    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        from kubernetes.client import V1Binding, V1ObjectMeta, V1ObjectReference

        body = V1Binding(metadata=V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
                         target=V1ObjectReference(api_version="v1", kind="Node", name=node))
        # Raw response: older clients fail to deserialise the Binding the server echoes back.
        resp = self._call(f"POST binding {namespace}/{name} → {node}", lambda: self.core.create_namespaced_pod_binding(
            name, namespace, body, _preload_content=False, _request_timeout=self.timeout))
        # Drain the (small) answer: urllib3 returns a connection to its pool only once the body has
        # been read. Unread, every bind left its TLS connection to the garbage collector and the
        # next call paid a new TCP + TLS handshake (measured: one handshake per bind, ~28 ms).
        resp.data  # noqa: B018 - read for its side effect
