"""An extender process with extra flags (TLS, agent Leases), and the scheduler's TLS extender entry."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.testenv.config import ExtenderConfig
from tests.e2e.e2e_support import GPUPOOL_CLI, ExtenderProcess, _cli_env, free_port, log_tail


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

    def start(self) -> None:
        cmd = [*GPUPOOL_CLI, "extender", "--host", "127.0.0.1", "--port", str(self.port),
               "--kubeconfig", str(self.kubeconfig), "--policy", self.policy,
               "--lease-namespace", "default", "--identity", "e2e-extender", "--unconfirmed-timeout", "600",
               *(("--health-port", str(self.health_port)) if self.tls else ()), *self.extra_args]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_cli_env())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log_tail(self.log_path)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"extender not ready:\n{log_tail(self.log_path)}")


@dataclass(frozen=True)
class TlsExtenderConfig(ExtenderConfig):
    """An extender entry with kube-scheduler's ``tlsConfig`` (certFile, keyFile, caFile)."""

    tls_config: dict[str, str] = field(default_factory=dict)

    def to_v1beta1(self) -> dict[str, Any]:
        entry = super().to_v1beta1()
        entry["tlsConfig"] = dict(self.tls_config)
        return entry
