"""Writes each GpuQuota's ``status`` (used and hard, per dimension and per GPU model; see
:mod:`gpupool.api.quota_status`) from the ledger, so ``kubectl get gpuquota -o yaml`` shows where a
namespace stands without the extender's metrics.

Who writes: the leader only (every replica's ledger is the same, and one writer means no two
replicas overwriting each other with answers a few milliseconds apart). When: every
``interval_s`` (default 5 s) a pass compares each quota's status as computed now with the status
the watch last delivered and with what this replica last wrote, and writes only the ones that
differ, at most ``max_writes`` per pass (those waiting longest first), so a busy cluster costs at
most ``max_writes / interval_s`` writes a second however often its pods come and go, and an idle
one none. The ledger is not blocked by the writes: the statuses are computed under its lock, and
written after it is released.

The write is a JSON patch of ``/status`` on the status subresource (the CRD declares it; RBAC
``patch`` on ``gpuquotas/status``); a quota deleted meanwhile (404) is skipped, other errors are
logged and retried on the next pass. Nothing the scheduler decides reads the status: the ledger
stays the only count (docs/tenancy.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpupool.api.quota_status import quota_status
from gpupool.api.tenancy import API_VERSION
from gpupool.extender.ledger_reads import TenancyLedger

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0
DEFAULT_MAX_WRITES = 50
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True)
class StatusWrite:
    """One quota whose status is to be written."""

    namespace: str
    name: str
    status: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class QuotaStatusWriter:
    """The leader's periodic writer of GpuQuota statuses."""

    def __init__(self, ledger: TenancyLedger, custom_api: Any, is_leader: Callable[[], bool], *,
                 interval_s: float = DEFAULT_INTERVAL_S, max_writes: int = DEFAULT_MAX_WRITES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger = ledger
        self.custom_api = custom_api
        self.is_leader = is_leader
        self.interval_s = interval_s
        self.max_writes = max_writes
        self.clock = clock
        self.written: dict[str, dict[str, Any]] = {}
        """What this replica last wrote per quota (the watch's echo may not have arrived yet)."""
        self.written_at: dict[str, float] = {}

    def pending(self) -> list[StatusWrite]:
        """The quotas whose status differs from both the last one seen and the last one written,
        those waiting longest first, at most ``max_writes``."""
        ledger, found, existing = self.ledger, [], set()
        with ledger.lock:
            if not ledger.synced:
                return []
            book = ledger.tenancy
            for namespace, held in book.quotas.items():
                used = ledger.state.usage.of(namespace)
                for name, quota in held.items():
                    key = f"{namespace}/{name}"
                    existing.add(key)
                    status = quota_status(quota, used, book.broken_quotas.get(key))
                    if status != book.quota_status.get(key) and status != self.written.get(key):
                        found.append(StatusWrite(namespace, name, status))
        for key in [k for k in self.written if k not in existing]:  # deleted quotas
            self.written.pop(key, None)
            self.written_at.pop(key, None)
        found.sort(key=lambda w: (self.written_at.get(w.key, 0.0), w.key))
        return found[:self.max_writes]

    def write(self, change: StatusWrite) -> bool:
        """Patch one quota's status; False when it failed (retried on a later pass)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom_api.patch_namespaced_custom_object_status(
                self.ledger.tenancy.names.api_group, API_VERSION, change.namespace, "gpuquotas", change.name,
                [{"op": "add", "path": "/status", "value": change.status}], _content_type=JSON_PATCH)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("GpuQuota %s: status not written (HTTP %s): %s", change.key, exc.status, exc.reason)
                return False
        except Exception as exc:  # a connection error: the next pass retries
            log.warning("GpuQuota %s: status not written: %s", change.key, exc)
            return False
        self.written[change.key] = change.status
        self.written_at[change.key] = self.clock()
        return True

    def run_once(self) -> int:
        """One pass (leader only); the number of statuses written."""
        if not self.is_leader():
            self.written.clear()  # a later term compares with the watch's view afresh
            return 0
        return sum(self.write(change) for change in self.pending())

    def start(self, stop: threading.Event) -> threading.Thread:
        """Run passes every ``interval_s`` until ``stop`` is set."""

        def loop() -> None:
            while not stop.wait(self.interval_s):
                try:
                    self.run_once()
                except Exception:  # never let the writer die: it only reports
                    log.exception("GpuQuota status pass failed")

        thread = threading.Thread(target=loop, name="gpuquota-status", daemon=True)
        thread.start()
        return thread
