"""Leave the start-up checks' summary on the agent's Node (:data:`~gpupool.nodeagent.selfcheck.CHECKS_ANNOTATION`).

The log says it first, but an admin looking at a node with ``kubectl describe node`` should not have
to find the agent's pod to learn that it runs with, say, whole cards only or no refusal at open.
Written once at start, retried with back-off while the API refuses it (the agent serves regardless).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from gpupool.nodeagent.selfcheck import CHECKS_ANNOTATION, Check, annotation_patch

log = logging.getLogger(__name__)

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 30.0


async def publish_checks(core_v1: Any, node: str, checks: Sequence[Check], *,
                         first_retry_s: float = FIRST_RETRY_S,
                         now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
    """Patch the node until it succeeds (back-off doubling up to :data:`MAX_RETRY_S`)."""
    patch = annotation_patch(checks, now())
    delay = first_retry_s
    while True:
        try:
            await asyncio.to_thread(core_v1.patch_node, node, patch)
            log.info("start-up checks written on node %s (%s)", node, CHECKS_ANNOTATION)
            return
        except Exception as exc:  # the API may be away for a while: keep trying
            log.warning("writing the start-up checks on node %s failed (%s); retrying in %.0f s", node,
                        getattr(exc, "reason", None) or exc, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_RETRY_S)
