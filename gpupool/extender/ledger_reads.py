"""What readers outside the four verbs read of the ledger: the webhooks, the quota status writer.

Why apart from :class:`gpupool.extender.service.Ledger`: that port is what the service decides and
books with; these readers only look, under the ledger's lock, at its state and its tenancy objects.
Each takes the narrowest protocol that serves it, and the wiring code hands all of them the one
:class:`gpupool.extender.cache.ClusterCache`.
"""

from __future__ import annotations

import threading
from typing import Protocol

from gpupool.core.state import ClusterState
from gpupool.kube.tenancy_book import TenancyBook


class ReadyLedger(Protocol):
    """The booked cluster state, the lock to read it under, and whether it is complete yet."""

    lock: threading.RLock
    state: ClusterState

    @property
    def synced(self) -> bool:
        """True once the ledger reflects a full list of nodes and pods."""


class TenancyLedger(ReadyLedger, Protocol):
    """:class:`ReadyLedger` with the tenancy objects (groups, quotas, namespaces' defaults) it keeps."""

    tenancy: TenancyBook
