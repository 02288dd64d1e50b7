"""The state file that lets ``gpupool testenv down`` stop what ``gpupool testenv up`` started.

``up`` exits while the components keep running, so the pids, paths and the mount points it
created are written to ``<state dir>/state.json``. ``down`` reads it back, checks each pid still
runs the recorded executable, and stops everything in reverse order.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.testenv.controlplane import stop_recorded
from gpupool.testenv.kubelet import remove_mount_points, stop_recorded_kubelet
from gpupool.testenv.procs import ManagedProcess

#: Environment variable that moves the CLI's state directory.
STATE_ENV = "GPUPOOL_TESTENV_STATE"
STATE_FILE = "state.json"


def default_state_dir() -> Path:
    """``$GPUPOOL_TESTENV_STATE`` or ``/tmp/gpupool-testenv``."""
    return Path(os.environ.get(STATE_ENV) or "/tmp/gpupool-testenv")


@dataclass
class EnvState:
    """What ``up`` recorded: the control plane, its kubelets, mount points it created, and processes
    started beside them on the cluster (``up --demo``: gpupool's components), stopped first."""

    control_plane: dict[str, Any]
    kubelets: list[dict[str, Any]] = field(default_factory=list)
    created_mount_points: list[str] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig of the recorded control plane."""
        return Path(self.control_plane["kubeconfig"])

    def running(self) -> bool:
        """Whether any recorded component still runs."""
        records = [*self.control_plane["processes"], *self.processes]
        for kubelet in self.kubelets:
            records.extend(kubelet["processes"])
        return any(ManagedProcess.from_record(r).alive() for r in records)


def save_state(state_dir: Path, state: EnvState) -> Path:
    """Write ``state`` to ``<state_dir>/state.json`` and return the path."""
    path = state_dir / STATE_FILE
    path.write_text(json.dumps({"control_plane": state.control_plane, "kubelets": state.kubelets,
                                "created_mount_points": state.created_mount_points,
                                "processes": state.processes}, indent=2))
    return path


def load_state(state_dir: Path) -> EnvState | None:
    """The recorded state, or ``None`` when nothing was recorded in ``state_dir``."""
    path = state_dir / STATE_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return EnvState(control_plane=data["control_plane"], kubelets=list(data.get("kubelets", [])),
                    created_mount_points=list(data.get("created_mount_points", [])),
                    processes=list(data.get("processes", [])))


def stop_state(state_dir: Path, state: EnvState) -> None:
    """Stop the processes started beside the cluster (newest first), kubelets, then the control
    plane, and delete ``state_dir``."""
    for record in reversed(state.processes):
        ManagedProcess.from_record(record).stop()
    for kubelet in reversed(state.kubelets):
        stop_recorded_kubelet(kubelet)
    remove_mount_points([Path(p) for p in state.created_mount_points])
    stop_recorded(state.control_plane)
    shutil.rmtree(state_dir, ignore_errors=True)
