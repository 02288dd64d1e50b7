"""The plugin's only contact with the cluster: load a kubeconfig as kubectl does, and read nodes and pods.

Why not :func:`gpupool.kube.client_config.api_configuration`: the plugin runs on a user's machine
with a kubeconfig and must honour ``--context`` as kubectl does; the components' loader prefers
the in-cluster service account and has no context. ``KUBECONFIG`` (with ``:``-separated files) and
``~/.kube/config`` are the official client's defaults, the same as kubectl's.

Objects are read as the API's JSON (``_preload_content=False``): the translation takes camelCase
dicts, and skipping the client's model classes is several times faster on a large cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpupool.kube.client_config import keep_environment_proxy

DEFAULT_NAMESPACE = "default"
REQUEST_TIMEOUT_S = 30.0
"""Per request: a list of 5,000 nodes is a few MB; an apiserver that does not answer in this long
is reported rather than waited on."""
MESSAGE_CHARS = 200
"""How much of an error body a message quotes."""


class ClusterAccessError(RuntimeError):
    """The kubeconfig cannot be loaded or the API refused a read; the message says which and why."""


class NotServedError(ClusterAccessError):
    """The API has no such resource (404): a CRD that is not installed."""


@dataclass(frozen=True)
class Connection:
    """A configured API client and the namespace the kubeconfig's context names."""

    api: Any
    namespace: str


def connect(kubeconfig: str | None, context: str | None) -> Connection:
    """Load ``kubeconfig`` (default: ``KUBECONFIG``, else ``~/.kube/config``) with ``context`` (default:
    its current context)."""
    from kubernetes import client
    from kubernetes import config as config_module

    loaders: Any = config_module  # the client's loaders are untyped
    configuration = client.Configuration()
    try:
        loaders.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration,
                                 persist_config=False)
        contexts, active = loaders.list_kube_config_contexts(config_file=kubeconfig)
    except (loaders.ConfigException, OSError, ValueError) as exc:
        raise ClusterAccessError(f"cannot load the kubeconfig: {exc}") from None
    chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
    namespace = str(((chosen or {}).get("context") or {}).get("namespace") or DEFAULT_NAMESPACE)
    keep_environment_proxy(configuration)
    return Connection(api=client.CoreV1Api(client.ApiClient(configuration)), namespace=namespace)


def _read(call: Any, what: str, *args: Any, **kwargs: Any) -> Any:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        response = call(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
    except ApiException as exc:
        error = NotServedError if exc.status == 404 else ClusterAccessError
        raise error(f"cannot read {what}: {exc.status} {exc.reason}") from None
    except HTTPError as exc:
        raise ClusterAccessError(f"cannot reach the API server to read {what}: {exc}") from None
    return json.loads(response.data)


def list_nodes(connection: Connection) -> list[dict[str, Any]]:
    """Every node, as the API's JSON."""
    items: list[dict[str, Any]] = _read(connection.api.list_node, "nodes").get("items") or []
    return items


def list_pods(connection: Connection) -> list[dict[str, Any]]:
    """Every pod of every namespace, as the API's JSON."""
    items: list[dict[str, Any]] = _read(connection.api.list_pod_for_all_namespaces, "pods").get("items") or []
    return items


def list_claims(connection: Connection) -> list[dict[str, Any]]:
    """Every ResourceClaim (``resource.k8s.io/v1``) of every namespace; none where the API server
    does not serve that version (DRA off, a Kubernetes before 1.34)."""
    try:
        return list_custom(connection, "resource.k8s.io", "v1", "resourceclaims")
    except NotServedError:
        return []


def read_node_proxy(connection: Connection, node: str, port: int, path: str, timeout_s: float) -> str:
    """``GET /api/v1/nodes/<node>:<port>/proxy/<path>``: the API server forwards it to the node's address
    (RBAC: ``get`` on ``nodes/proxy``). The body, or :class:`ClusterAccessError` saying why not."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        response = connection.api.connect_get_node_proxy_with_path(
            f"{node}:{port}", path, _preload_content=False, _request_timeout=timeout_s)
    except ApiException as exc:
        body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or "")
        raise ClusterAccessError(f"{exc.status} {exc.reason}: {_api_message(body)}") from None
    except HTTPError as exc:
        raise ClusterAccessError(f"no answer in {timeout_s:g} s ({type(exc).__name__})") from None
    data: bytes = response.data
    return data.decode(errors="replace")


def _api_message(body: str) -> str:
    """The ``message`` of an API ``Status`` body, else the body itself (the proxied server's answer), cut short."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    message = doc.get("message") or doc.get("error") if isinstance(doc, dict) else None
    return " ".join(str(message or body).split())[:MESSAGE_CHARS]


def read_pod(connection: Connection, namespace: str, name: str) -> dict[str, Any]:
    """One pod, as the API's JSON."""
    pod: dict[str, Any] = _read(connection.api.read_namespaced_pod, f"pod {namespace}/{name}", name, namespace)
    return pod


def list_custom(connection: Connection, group: str, version: str, plural: str) -> list[dict[str, Any]]:
    """Every object of a custom resource, in every namespace; :class:`NotServedError` when its CRD is
    not installed."""
    from kubernetes import client

    api = client.CustomObjectsApi(connection.api.api_client)
    items: list[dict[str, Any]] = _read(api.list_cluster_custom_object, f"{plural}.{group}", group, version,
                                        plural).get("items") or []
    return items


def list_leases(connection: Connection, namespace: str, label_selector: str) -> list[dict[str, Any]]:
    """The Leases of ``namespace`` that ``label_selector`` selects."""
    from kubernetes import client

    api = client.CoordinationV1Api(connection.api.api_client)
    items: list[dict[str, Any]] = _read(api.list_namespaced_lease, f"leases in {namespace}", namespace,
                                        label_selector=label_selector).get("items") or []
    return items


def read_config_map(connection: Connection, namespace: str, name: str) -> dict[str, Any]:
    """One ConfigMap, as the API's JSON; :class:`NotServedError` when there is none."""
    config_map: dict[str, Any] = _read(connection.api.read_namespaced_config_map, f"ConfigMap {namespace}/{name}",
                                       name, namespace)
    return config_map


def read_namespace(connection: Connection, name: str) -> dict[str, Any]:
    """One namespace, as the API's JSON."""
    namespace: dict[str, Any] = _read(connection.api.read_namespace, f"namespace {name}", name)
    return namespace
