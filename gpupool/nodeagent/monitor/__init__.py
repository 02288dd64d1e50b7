"""The GPU usage monitor: who opens which GPU device file, recorded per node, and when a card is idle.

Event sources (kernel-side: fanotify permission events; portable: a /proc scan) report opens and
closes of the watched device files behind :class:`~gpupool.nodeagent.monitor.events.EventSource`;
the recorder keeps the per-device holders in a state file; the idle rule turns usage samples into
free / busy / idle. See docs/monitor.md.
"""
