"""A ResourceClaim's allocation, as this node's driver prepares it: the claim's shares
(:mod:`gpupool.kube.dra_claims`, the reading every component shares) checked against what kubelet
asked for and this node's pool.

kubelet's NodePrepareResources names a claim (namespace, name, UID) and nothing else; a claim
deleted and re-created under that name, a claim with none of this driver's devices and a share of
another node's pool are refused here, so the plugin never prepares half a claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.kube.dra_claims import AllocatedShare, ClaimError, claim_shares

__all__ = ["AllocatedShare", "ClaimAllocation", "ClaimError", "ClaimRef", "read_allocation"]


@dataclass(frozen=True)
class ClaimRef:
    """What kubelet names: the claim's namespace, name and UID."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class ClaimAllocation:
    """A claim allocated on this node: its shares, and the pod it is reserved for (the first pod
    consumer; ``("", "")`` when none is named)."""

    claim: ClaimRef
    pod: tuple[str, str]
    pod_uid: str
    shares: tuple[AllocatedShare, ...]


def read_allocation(claim: ClaimRef, obj: Mapping[str, Any], driver: str, pool: str) -> ClaimAllocation:
    """The claim object ``obj`` (JSON as the API serves it) read for ``driver`` on ``pool``."""
    read = claim_shares(obj, driver, where=f"claim {claim}")
    if read.uid != claim.uid:
        raise ClaimError(f"claim {claim}: the API has UID {read.uid!r} under that name (deleted and re-created?)")
    if not read.shares:
        raise ClaimError(f"claim {claim} has no device of driver {driver}")
    for share in read.shares:
        if share.pool != pool:
            raise ClaimError(f"claim {claim}, request {share.request!r}, device {share.device!r}: allocated from "
                             f"pool {share.pool!r}, this node's pool is {pool!r}")
    pod = (claim.namespace, read.pod) if read.pod else ("", "")
    return ClaimAllocation(claim, pod, read.pod_uid, read.shares)
