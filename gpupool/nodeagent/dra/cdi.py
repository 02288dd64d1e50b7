"""CDI spec files: one per prepared claim, carrying the claim's container grant.

kubelet passes a prepared claim's CDI device IDs to the container runtime, which applies the
named device's ``containerEdits`` (env, device nodes, mounts) to every container using the claim;
that is how a DRA container gets what an Allocate response gives a device-plugin container. One
file per claim means unprepare removes exactly that claim's devices, and a file is written under a
temporary name and renamed, so a runtime never reads half a spec.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Any

from gpupool.files.replace import replace_file
from gpupool.nodeagent.types import ContainerGrant

#: The directory containerd and CRI-O read CDI specs from by default (the dynamic one).
DEFAULT_CDI_DIR = "/var/run/cdi"
#: The oldest CDI spec version with every edit used here; containerd 2 and CRI-O read it.
CDI_VERSION = "0.6.0"
CDI_CLASS = "claim"


@dataclass(frozen=True)
class CdiSpecs:
    """Where and under which kind (``<domain>/claim``) this node's claim specs are written."""

    directory: str
    vendor: str

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{CDI_CLASS}"

    def device_id(self, claim_uid: str) -> str:
        """The fully qualified CDI device name of a claim: ``gpupool.io/claim=<uid>``."""
        return f"{self.kind}={claim_uid}"

    def path(self, claim_uid: str) -> str:
        return os.path.join(self.directory, f"{self.vendor}-{CDI_CLASS}_{claim_uid}.json")

    def write(self, claim_uid: str, grant: ContainerGrant) -> str:
        """Write the claim's spec (replacing an older one); the CDI device ID. The directory is
        made when the write finds it missing (not checked before each of 100 writes at once)."""
        path = self.path(claim_uid)
        text = json.dumps(spec(self.kind, claim_uid, grant), separators=(",", ":"))
        # replace_file's temporary has a name of its own: two writes of one claim may run at once (threads)
        try:
            replace_file(path, text, mode=0o644)
        except FileNotFoundError:  # the directory is gone (first write, or removed by hand)
            os.makedirs(self.directory, exist_ok=True)
            replace_file(path, text, mode=0o644)
        return self.device_id(claim_uid)

    def exists(self, claim_uid: str) -> bool:
        return os.path.isfile(self.path(claim_uid))

    def remove(self, claim_uid: str) -> None:
        """Remove the claim's spec; nothing to do when it is gone already."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(claim_uid))


def spec(kind: str, claim_uid: str, grant: ContainerGrant) -> dict[str, Any]:
    """The CDI document for one claim: a single device named after the claim's UID."""
    edits: dict[str, Any] = {
        "env": [f"{k}={v}" for k, v in sorted(grant.envs.items())],
        "deviceNodes": [{"path": d.container_path, "hostPath": d.host_path, "permissions": d.permissions}
                        for d in grant.devices],
    }
    if grant.mounts:
        edits["mounts"] = [{"hostPath": m.host_path, "containerPath": m.container_path,
                            "options": ["bind", "ro" if m.read_only else "rw"]} for m in grant.mounts]
    return {"cdiVersion": CDI_VERSION, "kind": kind,
            "devices": [{"name": claim_uid, "containerEdits": edits}]}
