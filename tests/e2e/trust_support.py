"""An extender process with extra flags (TLS, agent Leases), and the scheduler's TLS extender entry."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.testenv.config import ExtenderConfig
from tests.e2e.e2e_support import ExtenderProcess, free_port


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
