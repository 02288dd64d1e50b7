"""Gathering :class:`gpupool.nodeagent.selfcheck.NodeFacts` on the node: the thin part that touches
the file system, NVML and the kernel (the verdicts are :mod:`gpupool.nodeagent.selfcheck`'s)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.isolation.backends import IsolationBackend, IsolationConfigError
from gpupool.nodeagent.isolation.setup import IsolationConfig
from gpupool.nodeagent.selfcheck import MONITOR_OFF, NodeFacts, PathFacts


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
    usage_monitor: bool = True
    """The usage monitor runs (then the kernel's refusal at open is probed: only it uses it)."""


def probe(options: ProbeOptions, inventory: Callable[[], GpuInventory],
          fanotify: Callable[[Sequence[str]], str | None], shared: Callable[[str], tuple[bool, str]],
          remote_server: Callable[[], str], *, gate: Callable[[], tuple[bool, str]] | None = None,
          library: Callable[[str], str] | None = None) -> NodeFacts:
    """The node's facts; ``inventory`` lists the cards (NVML or the fake file), ``fanotify`` probes
    the usage monitor's event source, ``shared`` describes the checkpoint root's file system,
    ``remote_server`` says why the GPU server cannot run ("" when it can), ``gate`` whether the
    kernel can refuse opens (with the usage monitor) and ``library`` why the interception library
    cannot be loaded ("" when it can); those two are not probed when not given."""
    cards: tuple[str, ...] | None
    paths: tuple[str, ...] = ()
    try:
        found = inventory()
        cards, error, paths = tuple(c.model for c in found.cards), "", found.device_paths
    except Exception as exc:  # NVML's errors, a bad fake file: the check reports, never raises
        cards, error = None, str(exc) or type(exc).__name__
    library_problem = ""
    try:
        choice = options.isolation.choice()
        isolation, isolation_error = choice.reason, ""
        shares, enforced = choice.shares, choice.backend is not IsolationBackend.NONE
        if choice.backend is IsolationBackend.SHIM and choice.library and library is not None:
            library_problem = library(choice.library)
    except IsolationConfigError as exc:
        isolation, isolation_error, shares, enforced = "", str(exc), False, False
    checkpoint = path_facts(options.lending_checkpoint_dir) if options.lending_checkpoint_dir else None
    return NodeFacts(
        cards=cards, cards_error=error, plugin_dir=path_facts(options.plugin_dir),
        kubelet_socket=path_facts(os.path.join(options.plugin_dir, "kubelet.sock")),
        pod_resources=path_facts(options.pod_resources_socket), isolation=isolation,
        isolation_error=isolation_error, shares=shares, enforced=enforced,
        monitor_source=(MONITOR_OFF if not options.usage_monitor else
                        fanotify(list(paths)) if paths else "no card device to watch"),
        checkpoint=checkpoint,
        checkpoint_shared=shared(checkpoint.path) if checkpoint is not None and checkpoint.exists else None,
        dra_dirs=tuple(path_facts(d) for d in options.dra_dirs),
        remote_server=remote_server() if options.remote_server else None,
        device_gate=_probe_gate(gate) if gate is not None and options.usage_monitor else None,
        library_problem=library_problem)


def _probe_gate(gate: Callable[[], tuple[bool, str]]) -> tuple[bool, str]:
    try:
        return gate()
    except Exception as exc:  # a kernel interface the probe did not foresee: reported, never raised
        return False, f"cgroup-device probe failed: {exc}"


#: What a loadable ELF shared object for this machine starts with: the magic, 64-bit, little-endian.
_ELF_HEAD = b"\x7fELF\x02\x01"
LOAD_TIMEOUT_S = 10.0


def library_problem(path: str) -> str:
    """Why the dynamic loader could not load ``path`` here ("" when it can): not an ELF object for
    this machine, or ``dlopen`` fails (a missing dependency, another architecture). Loaded in a
    child process, so nothing of it stays in the agent."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(_ELF_HEAD))
    except OSError as exc:
        return f"cannot read it ({exc.strerror})"
    if head != _ELF_HEAD:
        return "not a 64-bit little-endian ELF shared object"
    try:
        result = subprocess.run([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", path],
                                capture_output=True, text=True, timeout=LOAD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the load test did not finish ({exc})"
    if result.returncode == 0:
        return ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return lines[-1].removeprefix("OSError: ") if lines else f"dlopen failed (exit {result.returncode})"
