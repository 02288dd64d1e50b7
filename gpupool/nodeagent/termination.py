"""SIGTERM ends the node agent the way Ctrl-C does: its main task is cancelled, so every part's
clean-up runs before the process exits.

Without a handler SIGTERM killed the Python process at once: no ``finally`` ran, so the programs
the agent runs were left behind (its remote GPU server went on serving the last clients file,
found by an e2e), and as process 1 of its container the agent ignored SIGTERM altogether (the
kernel drops a signal process 1 has no handler for) and was killed only at the end of the pod's
grace period.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


async def run_until_terminated(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` until it ends, or until SIGTERM cancels it; returns normally after a SIGTERM
    (the agent was asked to stop), and lets any other cancellation or error through."""
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()
    terminated = False

    def terminate() -> None:
        nonlocal terminated
        if not terminated:
            log.info("SIGTERM: stopping (the agent's parts and the programs they run)")
        terminated = True
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        await task
    except asyncio.CancelledError:
        if not terminated or not task.cancelled():
            raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
