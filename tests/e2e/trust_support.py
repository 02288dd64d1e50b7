"""An extender process with extra flags (TLS, agent Leases), the scheduler calling it, its filter's
reason about one node, and the scheduler's TLS extender entry."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.api.names import ResourceNames
from gpupool.testenv.config import ExtenderConfig
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import ContainerLimits, ExtenderProcess, free_port, gpu_pod_manifest


class FlaggedExtender(ExtenderProcess):
    """``gpupool extender`` with ``extra_args``; readiness read from the plain health port when the
    verbs are served over TLS (the verbs' port then wants a client certificate)."""

    def __init__(self, kubeconfig: Path, log_path: Path, extra_args: tuple[str, ...] = (),
                 tls: bool = False) -> None:
        super().__init__(kubeconfig, log_path)
        self.extra_args = extra_args
        self.tls = tls
        self.health_port = free_port() if tls else self.port

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def ready_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}/readyz"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}/metrics"

    def serving_args(self) -> tuple[str, ...]:
        return ("--health-port", str(self.health_port)) if self.tls else ()


@dataclass(frozen=True)
class TlsExtenderConfig(ExtenderConfig):
    """An extender entry with kube-scheduler's ``tlsConfig`` (certFile, keyFile, caFile)."""

    tls_config: dict[str, str] = field(default_factory=dict)

    def to_v1(self) -> dict[str, Any]:
        entry = super().to_v1()
        entry["tlsConfig"] = dict(self.tls_config)
        return entry


def scheduled_through(control_plane: ControlPlane, extender: FlaggedExtender) -> Iterator[FlaggedExtender]:
    """Start ``extender`` (plain HTTP) and have kube-scheduler call it for gpupool's resources; after
    the test (``yield from`` in a fixture) kill it and give the scheduler back its plain config."""
    extender.start()
    control_plane.restart_scheduler([
        ExtenderConfig(url_prefix=extender.url, filter_verb="filter", prioritize_verb="prioritize",
                       bind_verb="bind", weight=5, node_cache_capable=True,
                       managed_resources=ResourceNames().managed(), http_timeout_s=10.0)])
    try:
        yield extender
    finally:
        extender.kill()
        control_plane.restart_scheduler([])


def filter_reason(extender: FlaggedExtender, containers: list[ContainerLimits], node: str) -> str | None:
    """The extender's filter reason for ``node`` about a pod of ``containers`` (None: it passes)."""
    body = json.dumps({"Pod": gpu_pod_manifest("probe", containers) | {
        "metadata": {"name": "probe", "namespace": "default", "uid": "probe"}}, "NodeNames": [node]}).encode()
    request = urllib.request.Request(f"{extender.url}/filter", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    failed = answer.get("FailedNodes") or {}
    reason = failed.get(node)
    return None if reason is None else str(reason)
