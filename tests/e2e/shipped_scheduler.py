"""gpupool's own kube-scheduler, started from a shipped configuration (kustomize base or the Helm
chart's ConfigMap) with only what ties it to this test replaced: the API connection, the extender's
URL, its client-certificate files and, where a test asks, the leader-election namespace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpupool.testenv.controlplane import scheduler_args
from gpupool.testenv.ports import free_ports
from gpupool.testenv.probe import is_ok
from gpupool.testenv.procs import ManagedProcess, spawn, wait_until


def write_files(directory: Path, files: dict[str, bytes]) -> Path:
    """``files`` (name -> bytes) written into ``directory``, which is returned."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def start_shipped_scheduler(binary: Path, config: dict[str, Any], *, kubeconfig: Path, workdir: Path,
                            extender_url: str, client_dir: Path, what: str,
                            lease_namespace: str | None = None) -> tuple[ManagedProcess, Path]:
    """kube-scheduler ``binary`` running ``config`` (changed in place); returns it once healthy, with its log."""
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    if lease_namespace is not None:
        config["leaderElection"]["resourceNamespace"] = lease_namespace
    (entry,) = config["extenders"]
    entry["urlPrefix"] = extender_url
    entry["tlsConfig"] = {key: str(client_dir / Path(path).name) for key, path in entry["tlsConfig"].items()}
    path = workdir / "gpupool-scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    (port,) = free_ports(1)
    log = workdir / "gpupool-scheduler.log"
    process = spawn("kube-scheduler", [binary, *scheduler_args(config=path, kubeconfig=kubeconfig, port=port),
                                       "--authentication-skip-lookup=true"], log)
    wait_until(lambda: is_ok(f"https://127.0.0.1:{port}/healthz", verify=False), what=what, timeout=60,
               watch=[process])
    return process, log
