"""Gathering :class:`gpupool.nodeagent.selfcheck.NodeFacts` on the node: the thin part that touches
the file system, NVML and the kernel (the verdicts are :mod:`gpupool.nodeagent.selfcheck`'s)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.isolation.backends import IsolationBackend, IsolationConfigError
from gpupool.nodeagent.isolation.setup import IsolationConfig
from gpupool.nodeagent.selfcheck import NodeFacts, PathFacts


def path_facts(path: str) -> PathFacts:
    """What is at ``path``: whether it exists, is a directory or a socket, and is writable to us."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return PathFacts(path, exists=False)
    return PathFacts(path, True, stat.S_ISDIR(mode), stat.S_ISSOCK(mode), os.access(path, os.W_OK))


@dataclass(frozen=True)
class ProbeOptions:
    """The agent's options that decide what is checked."""

    plugin_dir: str
    pod_resources_socket: str
    isolation: IsolationConfig
    lending_checkpoint_dir: str | None = None
    dra_dirs: tuple[str, ...] = ()
    remote_server: bool = False


def probe(options: ProbeOptions, inventory: Callable[[], GpuInventory],
          fanotify: Callable[[Sequence[str]], str | None], shared: Callable[[str], tuple[bool, str]],
          remote_server: Callable[[], str]) -> NodeFacts:
    """The node's facts; ``inventory`` lists the cards (NVML or the fake file), ``fanotify`` probes
    the usage monitor's event source, ``shared`` describes the checkpoint root's file system and
    ``remote_server`` says why the GPU server cannot run ("" when it can)."""
    cards: tuple[str, ...] | None
    paths: tuple[str, ...] = ()
    try:
        found = inventory()
        cards, error, paths = tuple(c.model for c in found.cards), "", found.device_paths
    except Exception as exc:  # NVML's errors, a bad fake file: the check reports, never raises
        cards, error = None, str(exc) or type(exc).__name__
    try:
        choice = options.isolation.choice()
        isolation, isolation_error = choice.reason, ""
        shares, enforced = choice.shares, choice.backend is not IsolationBackend.NONE
    except IsolationConfigError as exc:
        isolation, isolation_error, shares, enforced = "", str(exc), False, False
    checkpoint = path_facts(options.lending_checkpoint_dir) if options.lending_checkpoint_dir else None
    return NodeFacts(
        cards=cards, cards_error=error, plugin_dir=path_facts(options.plugin_dir),
        kubelet_socket=path_facts(os.path.join(options.plugin_dir, "kubelet.sock")),
        pod_resources=path_facts(options.pod_resources_socket), isolation=isolation,
        isolation_error=isolation_error, shares=shares, enforced=enforced,
        monitor_source=fanotify(list(paths)) if paths else "no card device to watch",
        checkpoint=checkpoint,
        checkpoint_shared=shared(checkpoint.path) if checkpoint is not None and checkpoint.exists else None,
        dra_dirs=tuple(path_facts(d) for d in options.dra_dirs),
        remote_server=remote_server() if options.remote_server else None)


def remote_server_problem() -> str:
    """Why this installation cannot run the GPU server ("" when it can): it needs the prebuilt
    program, or a C compiler to build it at the server's first start."""
    from gpupool.shim.build import ShimBuildError, find_compiler
    from gpupool.shim.remote_build import PACKAGED_DIR, SERVER_NAME

    if (PACKAGED_DIR / SERVER_NAME).is_file():
        return ""
    try:
        find_compiler()
    except ShimBuildError:
        return f"no prebuilt GPU server at {PACKAGED_DIR / SERVER_NAME} and no C compiler to build one"
    return ""
