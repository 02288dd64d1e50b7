"""A real node agent that SIGKILLs itself right after its reclaim journal records one step (issue 28).

``python3 -m tests.e2e.agent_killed_at_step <step> <gpupool arguments>...``: ``<step>`` is a
:class:`~gpupool.nodeagent.lending.reclaim_journal.ReclaimStep` label (``recorded``, ``signalled``,
``deadline-passed``, ``stopped``, ``evicted``) or ``done``; the rest is ``gpupool``'s command line,
run unchanged (``node-agent --lending ...``). The kill comes from the agent's own process at the
exact step, which a test watching the journal file from outside could not hit reliably (the steps
are milliseconds apart).
"""

from __future__ import annotations

import sys

from gpupool.cli.main import main
from tests.nodeagent.lending.restart_driver import STEPS, die_after

if __name__ == "__main__":
    step, rest = sys.argv[1], sys.argv[2:]
    if step not in STEPS:
        raise SystemExit(f"step {step!r} is none of {STEPS}")
    die_after(step)
    sys.argv = ["gpupool", *rest]
    main()
