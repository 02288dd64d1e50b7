"""What a platform engineer needs to know about a node before trusting its agent, in one place.

``gpupool node-agent --check`` (docs/node-agent.md, "Checking a node") probes the node with the
agent's own options and prints one line per check: ``ok``, ``warn`` (the agent runs, with less than
it could) or ``fail`` (the agent would not start, or would serve nothing), each with what to do.
The agent runs the same checks at every start: it logs them, writes their summary on its Node
(:data:`~gpupool.api.cluster_settings.AGENT_CHECKS_ANNOTATION`) and, with
``--exit-on-failed-check`` (the chart's and the kustomize package's choice), stops at once on a
failure instead of running half-served.
The judgement here is pure, over facts a probe gathered (:mod:`gpupool.nodeagent.selfcheck_probe`),
so every verdict is tested without a GPU, kubelet or root.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    """One verdict: what was checked, the outcome, what was found and, unless ok, what to do."""

    name: str
    status: Status
    detail: str
    hint: str = ""


@dataclass(frozen=True)
class PathFacts:
    """What a probe found at a path the agent needs."""

    path: str
    exists: bool
    is_dir: bool = False
    is_socket: bool = False
    writable: bool = False


@dataclass(frozen=True)
class NodeFacts:
    """Everything the checks judge, as one probe of the node found it."""

    cards: tuple[str, ...] | None
    """Model of each card found (an empty tuple: none), None when the GPUs could not be listed."""
    cards_error: str
    plugin_dir: PathFacts
    kubelet_socket: PathFacts
    pod_resources: PathFacts
    isolation: str
    """The enforcement the agent would choose, as it logs it; "" when the choice is impossible."""
    isolation_error: str
    shares: bool
    """Whether the node would advertise shares (false: whole cards only)."""
    enforced: bool
    """Whether the chosen enforcement holds shares (false for ``--isolation none``)."""
    monitor_source: str | None
    """None when fanotify reports every open of the cards, else why not (the /proc scan then runs);
    :data:`MONITOR_OFF` with ``--no-usage-monitor``."""
    checkpoint: PathFacts | None = None
    """The checkpoint root with ``--lending`` (None without)."""
    checkpoint_shared: tuple[bool, str] | None = None
    dra_dirs: tuple[PathFacts, ...] = ()
    """kubelet's plugin registry and plugins directories, and the CDI directory, with ``--dra``."""
    remote_server: str | None = None
    """With ``--remote-gpu-server``: "" when the GPU server can run, else why not."""
    device_gate: tuple[bool, str] | None = None
    """With the usage monitor: whether the kernel's cgroup-device programs can refuse a container's
    open of a card (cgroup v2 and BPF), and why or why not."""
    library_problem: str = ""
    """Why the interception library the agent would mount into containers cannot be loaded ("" when
    it can, or when none is used)."""


def judge(facts: NodeFacts) -> list[Check]:
    """The verdicts, in the order an admin fixes them."""
    checks = [_cards(facts), _directory("device plugins", facts.plugin_dir, "kubelet's device-plugin directory "
                                        "(--plugin-dir) as the agent's pod mounts it"),
              _socket("kubelet", facts.kubelet_socket, WARN_KUBELET_SOCKET),
              _socket("pod resources", facts.pod_resources, FAIL_POD_RESOURCES, fail=True),
              _isolation(facts), _monitor(facts)]
    if facts.device_gate is not None:
        checks.append(_device_gate(*facts.device_gate))
    if facts.checkpoint is not None:
        checks.append(_checkpoint(facts.checkpoint, facts.checkpoint_shared))
    checks += [_directory("dra", d, "a directory --dra writes") for d in facts.dra_dirs]
    if facts.remote_server is not None:
        problem = facts.remote_server
        checks.append(Check("remote gpu server", Status.FAIL if problem else Status.OK,
                            problem or "the GPU server can run", REMOTE_HINT if problem else ""))
    return checks


WARN_KUBELET_SOCKET = "start the agent on a node whose kubelet runs; it registers once kubelet.sock appears"
FAIL_POD_RESOURCES = ("mount kubelet's pod-resources directory (--pod-resources-socket): without it the agent "
                      "cannot tell which container kubelet gave which device")
REMOTE_HINT = ("use the image (it ships the server prebuilt) or install a C compiler and OpenSSL 3's headers "
               "(`gpupool remote-gpu build --into DIR`)")


def _cards(facts: NodeFacts) -> Check:
    if facts.cards is None:
        return Check("gpus", Status.FAIL, f"cannot list the cards: {facts.cards_error}",
                     "check the NVIDIA driver and the runtime class that gives the agent NVML "
                     "(nodeAgent.runtimeClassName), or give --fake-gpus")
    if not facts.cards:
        return Check("gpus", Status.WARN, "no cards found: the node serves no GPU",
                     "run the agent only on GPU nodes (label them gpupool.io/node-agent=true)")
    models = sorted(set(facts.cards))
    return Check("gpus", Status.OK, f"{len(facts.cards)} card(s): {', '.join(models)}")


def _directory(name: str, path: PathFacts, what: str) -> Check:
    if not path.exists or not path.is_dir:
        return Check(name, Status.FAIL, f"{path.path}: not a directory", f"mount {what} into the agent")
    if not path.writable:
        return Check(name, Status.FAIL, f"{path.path}: not writable", "run the agent as root with the directory "
                     "mounted read-write")
    return Check(name, Status.OK, f"{path.path}: writable")


def _socket(name: str, path: PathFacts, hint: str, fail: bool = False) -> Check:
    if path.is_socket:
        return Check(name, Status.OK, f"{path.path}: a socket")
    found = "not a socket" if path.exists else "missing"
    return Check(name, Status.FAIL if fail else Status.WARN, f"{path.path}: {found}", hint)


def _isolation(facts: NodeFacts) -> Check:
    if facts.isolation_error:
        return Check("enforcement", Status.FAIL, facts.isolation_error, "fix --isolation / --shim-library")
    if facts.library_problem:
        return Check("enforcement", Status.FAIL, f"{facts.isolation}, which cannot be loaded: {facts.library_problem}",
                     "give --shim-library a library built for this node (`gpupool shim build`; the image ships "
                     "one): the dynamic loader skips a preload it cannot load, so its shares would NOT be enforced")
    if not facts.shares:
        return Check("enforcement", Status.WARN, facts.isolation, "whole cards only: give the interception library "
                     "(`gpupool shim build`, --shim-library) or choose --isolation mps")
    if not facts.enforced:
        return Check("enforcement", Status.WARN, facts.isolation, "shares on this node are placed but NOT enforced")
    return Check("enforcement", Status.OK, facts.isolation)


MONITOR_OFF = "off (--no-usage-monitor)"


def _monitor(facts: NodeFacts) -> Check:
    if facts.monitor_source == MONITOR_OFF:
        return Check("usage monitor", Status.WARN, f"{MONITOR_OFF}: no idle cards marked, no risk checks, no lending",
                     "drop --no-usage-monitor (docs/monitor.md)")
    if facts.monitor_source is None:
        return Check("usage monitor", Status.OK, "fanotify reports every open of the cards")
    return Check("usage monitor", Status.WARN, f"{facts.monitor_source}; the /proc scan runs instead (an open is "
                 "seen within its interval, not at once)", "give the agent CAP_SYS_ADMIN on a kernel with "
                 "CONFIG_FANOTIFY_ACCESS_PERMISSIONS for opens seen at once (docs/monitor.md)")


def _device_gate(available: bool, reason: str) -> Check:
    if available:
        return Check("refusal at open", Status.OK, reason)
    return Check("refusal at open", Status.WARN, f"{reason}: a container's open of a card it may not use is not "
                 "refused by the kernel (lending and --risk-action refuse-opens reclaim or report instead)",
                 "run the node on cgroup v2 (cgroup v1 has no device programs gpupool can attach) and give the "
                 "agent CAP_SYS_ADMIN (CAP_BPF) (docs/monitor.md)")


def _checkpoint(path: PathFacts, shared: tuple[bool, str] | None) -> Check:
    if not path.exists:
        return Check("checkpoints", Status.WARN, f"{path.path}: missing; the agent creates it",
                     "mount shared storage there first for checkpoints that move between nodes (docs/lending.md)")
    if not path.is_dir or not path.writable:
        return Check("checkpoints", Status.FAIL, f"{path.path}: not a writable directory",
                     "give --checkpoint-dir a directory the agent may write")
    if shared is not None and not shared[0]:
        return Check("checkpoints", Status.WARN, shared[1], "mount shared storage (NFS, CephFS) there on every GPU "
                     "node so a borrower resumes wherever it is placed again")
    return Check("checkpoints", Status.OK, shared[1] if shared is not None else f"{path.path}: writable")


def exit_code(checks: Sequence[Check]) -> int:
    """1 when any check failed (the agent would not start, or serve nothing), else 0."""
    return 1 if any(c.status is Status.FAIL for c in checks) else 0


def render(checks: Sequence[Check]) -> list[str]:
    """One line per check, its hint indented under it."""
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for check in checks:
        lines.append(f"{check.status.value:<5}{check.name:<{width + 2}}{check.detail}")
        if check.hint:
            lines.append(f"{'':<{width + 7}}-> {check.hint}")
    return lines


def summary(checks: Sequence[Check]) -> str:
    """One line for people: the counts, then each check that is not ok with what was found."""
    counts = {status: sum(c.status is status for c in checks) for status in Status}
    head = ", ".join(f"{counts[status]} {status.value}" for status in Status if counts[status])
    problems = [f"{c.status.value} {c.name}: {c.detail}" for c in checks if c.status is not Status.OK]
    return "; ".join([head or "no checks", *problems])


def checks_annotation(checks: Sequence[Check], at: datetime) -> str:
    """The value of :data:`~gpupool.api.cluster_settings.AGENT_CHECKS_ANNOTATION`: the start-up
    checks' :func:`summary`, stamped with when they ran (they are not re-run: a warning fixed since
    shows until the next start)."""
    return f"{at.strftime('%Y-%m-%dT%H:%M:%SZ')} at start: {summary(checks)}"
