"""Small helpers shared by the end-to-end tests: pod manifests and polling."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gpupool.testenv.kubelet import Kubelet

T = TypeVar("T")

#: ``make_node(name=None, allocatable=None, labels=None) -> node name`` (fixture ``make_node``).
MakeNode = Callable[..., str]
#: ``start_kubelet(node_name, labels=None, extra_config=None) -> Kubelet`` (fixture ``start_kubelet``).
StartKubelet = Callable[..., Kubelet]

#: A scheduler name nobody serves: pods with it stay unscheduled until a test binds them.
NO_SCHEDULER = "gpupool-e2e-nobody"


def pod_manifest(
    name: str,
    *,
    limits: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    node_name: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    scheduler_name: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A one-container pod; extended resources go in ``limits`` (requests default to them)."""
    container: dict[str, Any] = {"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"]}
    if limits:
        container["resources"] = {"limits": dict(limits)}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 1}
    if node_name:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": dict(labels or {})}, "spec": spec}


def wait_for(probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll ``probe`` until it returns something other than ``None``/``False``; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def condition(obj: Any, kind: str) -> Any:
    """The status condition of type ``kind`` of a client model object, or ``None``."""
    for cond in obj.status.conditions or []:
        if cond.type == kind:
            return cond
    return None
