"""``gpupool node-agent``: the device plugin and node agent of one node."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import click

from gpupool.api.agent_lease import DEFAULT_LEASE_DURATION_S, DEFAULT_RENEW_INTERVAL_S
from gpupool.api.cluster_settings import ClusterSettings, Setting
from gpupool.api.environment import COMPUTE_MODE_HARD, COMPUTE_MODES
from gpupool.api.lending import DEFAULT_CHECKPOINT_DEADLINE_S
from gpupool.api.names import ResourceNames
from gpupool.api.shim_contract import MAX_RENEW_S
from gpupool.cli import cluster_options
from gpupool.cli.cluster_options import ClusterFlags, cluster_setting_options, describe
from gpupool.cli.old_flags import old_spelling
from gpupool.cli.server_options import server_limit_options
from gpupool.netguard.limits import ServerLimits
from gpupool.nodeagent.deviceplugin.api import DEVICE_PLUGIN_DIR, POD_RESOURCES_SOCKET
from gpupool.nodeagent.dra.api import KUBELET_DIR
from gpupool.nodeagent.dra.cdi import DEFAULT_CDI_DIR
from gpupool.nodeagent.dra.setup import DraOptions
from gpupool.nodeagent.driver_libraries import (
    DriverLibraries,
    DriverLibrariesEnforcement,
    DriverLibraryError,
)
from gpupool.nodeagent.driver_libraries import driver_libraries as find_driver_libraries
from gpupool.nodeagent.foreign_capacity import foreign_capacity
from gpupool.nodeagent.heartbeat import HeartbeatSettings
from gpupool.nodeagent.isolation.backends import (
    AUTO,
    CHOICES,
    BackendChoice,
    IsolationBackend,
    IsolationConfigError,
    enforcement_notice,
    packaged_library,
)
from gpupool.nodeagent.isolation.dmem import CGROUP_ROOT
from gpupool.nodeagent.isolation.mps_daemon import DEFAULT_MPS_CONTROL
from gpupool.nodeagent.isolation.setup import IsolationConfig
from gpupool.nodeagent.isolation.shim_files import DEFAULT_STATE_DIR
from gpupool.nodeagent.isolation.shim_registry import HEARTBEAT_S
from gpupool.nodeagent.isolation.shim_socket import MAX_CONNECTIONS, READ_TIMEOUT_S, RegistrationLimits
from gpupool.nodeagent.lending.cuda_suspend import DEFAULT_CUDA_CHECKPOINT_TIMEOUT_S
from gpupool.nodeagent.lending.options import (
    DEFAULT_ACTIVE_MEMORY_MIB,
    DEFAULT_ACTIVE_PERCENT,
    DEFAULT_ACTIVE_SAMPLES,
    DEFAULT_CHECKPOINT_ROOT,
    ActivityThresholds,
    LendingOptions,
)
from gpupool.nodeagent.metrics import DEFAULT_METRICS_PORT
from gpupool.nodeagent.monitor.idle import DEFAULT_IDLE_AFTER_SECONDS
from gpupool.nodeagent.monitor.scripted_usage import parse_duration
from gpupool.nodeagent.monitor.service import MonitorConfig
from gpupool.nodeagent.monitor.state_file import DEFAULT_STATE_PATH
from gpupool.nodeagent.risk.backstop import DEFAULT_OVERHEAD_MIB
from gpupool.nodeagent.risk.detector import DEFAULT_GRACE_S
from gpupool.nodeagent.risk.findings import RiskAction
from gpupool.nodeagent.risk.setup import ACTIONS

if TYPE_CHECKING:
    from gpupool.nodeagent.agent import NodeAgent
    from gpupool.nodeagent.dra.setup import DraDriver
    from gpupool.nodeagent.monitor.container_gate import ContainerGate
    from gpupool.nodeagent.monitor.service import UsageMonitor
    from gpupool.nodeagent.remote_setup import RemoteGpuOptions
    from gpupool.nodeagent.risk.decider import RiskOpenDecider
    from gpupool.nodeagent.selfcheck import Check
    from gpupool.nodeagent.selfcheck_probe import ProbeOptions


def _duration(value: str, option: str = "--idle-after") -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None
    if seconds <= 0:
        raise click.BadParameter("must be longer than 0 s", param_hint=option)
    return seconds


@click.command("node-agent")
@click.option("--node-name", default=lambda: os.environ.get("NODE_NAME", socket.gethostname()),
              show_default="$NODE_NAME or hostname", help="This node's name in Kubernetes.")
@click.option("--fake-gpus", type=click.Path(exists=True, dir_okay=False),
              help="Describe GPUs with a YAML file instead of NVML (see docs/node-agent.md).")
@click.option("--plugin-dir", default=DEVICE_PLUGIN_DIR, show_default=True)
@click.option("--pod-resources-socket", default=POD_RESOURCES_SOCKET, show_default=True)
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="Default: in-cluster, then ~/.kube.")
@click.option("--serve-aliases", default="", metavar="FAMILIES",
              help="Also serve these foreign resource families, comma-separated: gpushare "
                   "(aliyun.com/gpu-mem), gpumanager (tencent.com/vcuda-core, vcuda-memory). For nodes "
                   "that take over from those device plugins (docs/node-agent.md). HAMi's names: --hami "
                   "(\"hami\" here still works, deprecated).")
@click.option("--metrics-port", default=DEFAULT_METRICS_PORT, show_default=True,
              type=click.IntRange(0, 65535),
              help="Serve this node's per-card metrics on this port (GET /metrics); 0: none.")
@click.option("--usage-monitor/--no-usage-monitor", default=True, show_default=True,
              help="Watch opens of the GPU device files, sample usage, mark idle cards (docs/monitor.md).")
@click.option("--usage-state-file", default=DEFAULT_STATE_PATH, show_default=True,
              type=click.Path(dir_okay=False), help="The usage monitor's state file (on a hostPath).")
@click.option("--idle-after", default=f"{DEFAULT_IDLE_AFTER_SECONDS / 60:g}m", show_default=True,
              metavar="DURATION", help="A held card without SM activity this long is idle (e.g. 90s, 10m, 1h).")
@click.option("--isolation", type=click.Choice(CHOICES), default=AUTO, show_default=True,
              help="What enforces the shares: shim (the interception library), mps (the agent runs the MPS "
                   "control daemon), none; auto: shim with --shim-library, else none (docs/isolation-backends.md).")
@click.option("--shim-library", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The interception library to mount into containers (`gpupool shim path` prints it).")
@click.option("--driver-libraries", default="none", show_default=True, metavar="none|host|DIR",
              help="Mount the NVIDIA driver's user-space libraries into GPU containers and set LD_LIBRARY_PATH, "
                   "so GPU pods run under plain runc: host (found as the NVIDIA container toolkit finds them, "
                   "ldconfig -p) or a directory holding them (docs/node-agent.md).")
@click.option("--compute-mode", type=click.Choice(COMPUTE_MODES), default=COMPUTE_MODE_HARD, show_default=True,
              help="hard: never above the compute share; soft: above it while the card is otherwise idle.")
@click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(file_okay=False),
              help="Per-container directories, the registration socket and the MPS directories live here.")
@click.option("--mps-control", default=DEFAULT_MPS_CONTROL, show_default=True,
              help="The MPS control daemon binary (--isolation mps).")
@click.option("--cgroup-root", default=CGROUP_ROOT, show_default=True, type=click.Path(file_okay=False),
              help="The host's cgroup v2 root, where dmem.max limits are written when the kernel has the dmem "
                   "controller (docs/isolation-backends.md).")
@click.option("--agent-lease-duration", "lease_duration", default=DEFAULT_LEASE_DURATION_S, show_default=True,
              type=click.IntRange(min=1),
              help="Seconds the extender waits after the last renewal before it stops placing GPU pods here.")
@click.option("--agent-lease-renew-interval", "lease_renew_interval", default=DEFAULT_RENEW_INTERVAL_S,
              show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds between renewals of the heartbeat Lease.")
@click.option("--risk-action", type=click.Choice(ACTIONS), default=RiskAction.REPORT.value, show_default=True,
              help="What to do about a process on a card outside its grant (docs/security.md, \"Risk detection\"): "
                   "report (event and metric), refuse-opens, evict (the pod), cordon-card. Needs the usage monitor.")
@click.option("--risk-grace", default=f"{DEFAULT_GRACE_S:g}s", show_default=True, metavar="DURATION",
              help="A holder is judged only after holding its card this long.")
@click.option("--risk-memory-tolerance", default=DEFAULT_OVERHEAD_MIB, show_default=True, type=click.IntRange(min=0),
              metavar="MIB", help="Driver memory (CUDA context, module code) allowed per process above a container's "
                                  "grant before the over-grant backstop reports it (docs/security.md).")
@click.option("--lending/--no-lending", default=False, show_default=True,
              help="Lend idle cards to waiting pods and apply the priority rules at every open (docs/lending.md).")
@click.option("--checkpoint-dir", default=DEFAULT_CHECKPOINT_ROOT, show_default=True,
              type=click.Path(file_okay=False), help="Per-task checkpoint directories (--lending; a hostPath).")
@click.option("--checkpoint-deadline", default=DEFAULT_CHECKPOINT_DEADLINE_S, show_default=True,
              type=click.FloatRange(min=0), help="Seconds a reclaimed task has to write its checkpoint (--lending).")
@click.option("--owner-active-percent", default=DEFAULT_ACTIVE_PERCENT, show_default=True, type=click.IntRange(1, 100),
              help="A lent card's owner computing at least this SM share is back (--lending; docs/lending.md).")
@click.option("--owner-active-memory", default=DEFAULT_ACTIVE_MEMORY_MIB, show_default=True,
              type=click.IntRange(min=1), metavar="MIB", help="... or holding this much more memory than while lent.")
@click.option("--owner-active-samples", default=DEFAULT_ACTIVE_SAMPLES, show_default=True, type=click.IntRange(min=1),
              help="... in this many usage samples in a row; then its loan ends as if it opened the card.")
@click.option("--cuda-checkpoint-timeout", default=DEFAULT_CUDA_CHECKPOINT_TIMEOUT_S, show_default=True,
              type=click.FloatRange(min=0), help="Seconds cuda-checkpoint may take to suspend what outlives the "
              "checkpoint deadline before it is killed (--lending; 0: never run it).")
@click.option("--registration-timeout", default=READ_TIMEOUT_S, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds a connection to the registration socket has to send its request line "
                   "(the library sends it at once; docs/security.md, Bounded servers).")
@click.option("--registration-max-connections", default=MAX_CONNECTIONS, show_default=True,
              type=click.IntRange(min=1),
              help="Connections the registration socket holds at once; past it a new one replaces the oldest "
                   "silent one.")
@click.option("--registration-heartbeat", default=HEARTBEAT_S, show_default=True,
              type=click.IntRange(1, MAX_RENEW_S),
              help="Seconds between the interception library's renewals of its registration (the container's "
                   "heartbeat); a process holding a card that has not renewed for 3 of them is a stale-heartbeat "
                   "risk (docs/isolation.md, Heartbeat).")
@click.option("--dra/--no-dra", default=False, show_default=True,
              help="Also be a DRA driver (gpu.<domain>): publish this node's ResourceSlice and prepare "
                   "ResourceClaims through kubelet's DRA plugin API (docs/dra.md).")
@click.option("--dra-kubelet-dir", default=KUBELET_DIR, show_default=True, type=click.Path(file_okay=False),
              help="kubelet's root directory as the agent sees it (--dra registers in its plugins_registry).")
@click.option("--cdi-dir", default=DEFAULT_CDI_DIR, show_default=True, type=click.Path(file_okay=False),
              help="Where --dra writes one CDI spec per prepared claim (the container runtime reads it).")
@click.option("--dra-checkpoint", default=None, type=click.Path(dir_okay=False),
              help="The prepared-claims file of --dra. Default: <dra-kubelet-dir>/plugins/gpu.<domain>/"
                   "prepared-claims.json.")
@click.option("--remote-gpu-server", "remote_listen", default=None, metavar="HOST:PORT",
              help="Serve remote GPU shares booked on this node's cards: run `gpupool remote-gpu serve` listening "
                   "here, keep its clients file and hand each client pod its token in a Secret "
                   "(docs/remote-gpu.md). Off by default.")
@click.option("--remote-gpu-endpoint", default=None, metavar="HOST:PORT",
              help="The address client pods dial for --remote-gpu-server (default: the listen address).")
@click.option("--remote-gpu-tls-cert", default=None, type=click.Path(dir_okay=False, exists=True),
              help="--remote-gpu-server speaks TLS with this certificate chain (PEM); needed off loopback.")
@click.option("--remote-gpu-tls-key", default=None, type=click.Path(dir_okay=False, exists=True),
              help="The private key (PEM) of --remote-gpu-tls-cert.")
@click.option("--remote-gpu-tls-ca", default=None, type=click.Path(dir_okay=False, exists=True),
              help="The CA (PEM) clients check the server's certificate with: handed to each client pod in its "
                   "Secret (key remote_tls_ca.pem).")
@click.option("--remote-gpu-enforce-compute", is_flag=True,
              help="Hold each remote client to its compute share (its calls run under the interception library).")
@click.option("--remote-gpu-allow-plain", is_flag=True,
              help="Serve remote clients plain TCP off loopback (tokens and data cross the network in the clear).")
@click.option("--check", "check_only", is_flag=True,
              help="Check this node with these options (GPUs, kubelet's directories, enforcement, usage monitor, "
                   "refusal at open, checkpoints, DRA, remote GPUs), print one line per check and exit: 1 if one "
                   "failed. The agent runs the same checks at every start and logs them.")
@click.option("--exit-on-failed-check/--no-exit-on-failed-check", default=False, show_default=True,
              help="Stop at start (exit 1) when a start-up check fails, instead of running with the failure "
                   "logged; the chart and the kustomize package set it (docs/node-agent.md).")
@click.option("-v", "--verbose", is_flag=True)
@server_limit_options(tls=False)
@cluster_setting_options(old_lease_namespace=True)
@old_spelling("--lease-duration", "--agent-lease-duration", "lease_duration", type=click.IntRange(min=1))
@old_spelling("--lease-renew-interval", "--agent-lease-renew-interval", "lease_renew_interval",
              type=click.FloatRange(min=0, min_open=True))
def node_agent(node_name: str, fake_gpus: str | None, plugin_dir: str, pod_resources_socket: str,
               kubeconfig: str | None, serve_aliases: str,
               metrics_port: int, usage_monitor: bool, usage_state_file: str, idle_after: str, isolation: str,
               shim_library: str | None, driver_libraries: str, compute_mode: str, state_dir: str, mps_control: str,
               cgroup_root: str,
               lease_duration: int, lease_renew_interval: float, risk_action: str,
               risk_grace: str, risk_memory_tolerance: int, lending: bool,
               checkpoint_dir: str, checkpoint_deadline: float, owner_active_percent: int, owner_active_memory: int,
               owner_active_samples: int, cuda_checkpoint_timeout: float, registration_timeout: float,
               registration_max_connections: int, registration_heartbeat: int, dra: bool, dra_kubelet_dir: str,
               cdi_dir: str,
               dra_checkpoint: str | None, remote_listen: str | None, remote_gpu_endpoint: str | None,
               remote_gpu_tls_cert: str | None, remote_gpu_tls_key: str | None, remote_gpu_tls_ca: str | None,
               remote_gpu_enforce_compute: bool, remote_gpu_allow_plain: bool, check_only: bool,
               exit_on_failed_check: bool, verbose: bool, server_limits: ServerLimits,
               cluster_flags: ClusterFlags) -> None:
    """Serve gpupool's kubelet device plugins and keep this node's GPU annotations current."""
    from gpupool.api.names import alias_family_resources

    families = [f.strip() for f in serve_aliases.split(",") if f.strip()]
    cluster_flags = _hami_from_aliases(cluster_flags, families)
    try:
        aliases = alias_family_resources([f for f in families if f != HAMI_FAMILY])
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--serve-aliases") from None
    monitor = MonitorConfig(usage_state_file, _duration(idle_after)) if usage_monitor else None
    try:
        HeartbeatSettings(duration_s=lease_duration, renew_interval_s=lease_renew_interval)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--agent-lease-renew-interval") from None
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    isolation_config = IsolationConfig(isolation, shim_library, state_dir, compute_mode, mps_control, cgroup_root,
                                       registration=RegistrationLimits(registration_timeout,
                                                                       registration_max_connections,
                                                                       registration_heartbeat),
                                       packaged=packaged_library())
    try:
        chosen = isolation_config.choice()  # refuse an impossible choice before anything starts or is read
    except IsolationConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--isolation") from None
    unloadable = _library_verdict(chosen)
    try:
        libraries = find_driver_libraries(driver_libraries)
    except DriverLibraryError as exc:
        raise click.BadParameter(str(exc), param_hint="--driver-libraries") from None
    from gpupool.nodeagent.selfcheck_probe import ProbeOptions

    probe_options = ProbeOptions(
        plugin_dir, pod_resources_socket, isolation_config, checkpoint_dir if lending else None,
        (os.path.join(dra_kubelet_dir, "plugins_registry"), os.path.join(dra_kubelet_dir, "plugins"), cdi_dir)
        if dra else (), remote_listen is not None, usage_monitor=usage_monitor)
    if check_only:
        sys.exit(_check_node(fake_gpus, probe_options, unloadable))
    start_checks = _start_checks(fake_gpus, probe_options, exit_on_failed_check, unloadable)
    # The checks judge the library as asked for (a failed "enforcement" naming it); the agent runs with
    # the verdict: a library that cannot be loaded enforces nothing, so the node takes whole cards only.
    isolation_config = replace(isolation_config, library_problem=unloadable)
    cluster = cluster_flags.resolve(cluster_options.read_with_client(kubeconfig))
    logging.getLogger(__name__).info("cluster settings: %s", describe(cluster, cluster_flags))
    if cluster.hami:
        aliases = (*aliases, *(a for a in alias_family_resources([HAMI_FAMILY]) if a not in aliases))
    lease_namespace = cluster.agent_lease_namespace
    beat = HeartbeatSettings(lease_namespace, lease_duration, lease_renew_interval) if lease_namespace else None
    names = cluster.resource_names()
    risk = (RiskAction(risk_action), _duration(risk_grace, "--risk-grace"), risk_memory_tolerance)
    if dra and risk[0] is not RiskAction.REPORT:
        raise click.BadParameter(f"{risk_action} cannot be combined with --dra yet: the risk checks grant a DRA "
                                 "container its claims' shares, but acting on their findings is not exercised with "
                                 "claims end to end (docs/dra.md); use --risk-action=report",
                                 param_hint="--risk-action")
    if lending and monitor is None:
        raise click.BadParameter("lending needs the usage monitor (drop --no-usage-monitor)", param_hint="--lending")
    activity = ActivityThresholds(owner_active_percent, owner_active_memory, owner_active_samples)
    lend = LendingOptions(checkpoint_dir, checkpoint_deadline, cluster.high_priority_threshold, activity,
                          cuda_checkpoint_timeout, state_dir) if lending else None
    dra_options = DraOptions(dra_kubelet_dir, cdi_dir, dra_checkpoint) if dra else None
    remote = _remote_options(remote_listen, remote_gpu_endpoint, state_dir,
                             RemoteServerFlags(remote_gpu_tls_cert, remote_gpu_tls_key, remote_gpu_tls_ca,
                                               remote_gpu_enforce_compute, remote_gpu_allow_plain))
    asyncio.run(_run(node_name, fake_gpus, plugin_dir, pod_resources_socket, kubeconfig, names, aliases,
                     metrics_port, monitor, isolation_config, beat, risk, lend, server_limits, dra_options,
                     cluster=cluster, remote=remote, libraries=libraries, start_checks=start_checks))


@dataclass(frozen=True)
class RemoteServerFlags:
    """The ``--remote-gpu-*`` flags that shape the server the agent runs."""

    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    enforce_compute: bool = False
    allow_plain: bool = False

    def given(self) -> list[str]:
        """The flags set, spelled as on the command line."""
        return [flag for flag, value in (("--remote-gpu-tls-cert", self.tls_cert),
                                         ("--remote-gpu-tls-key", self.tls_key), ("--remote-gpu-tls-ca", self.tls_ca),
                                         ("--remote-gpu-enforce-compute", self.enforce_compute),
                                         ("--remote-gpu-allow-plain", self.allow_plain)) if value]


def _library_verdict(choice: BackendChoice) -> str:
    """Why the interception library ``choice`` would mount cannot be loaded here ("" when it can, or
    when the backend mounts none): probed once, for the start-up checks and the backend alike."""
    from gpupool.nodeagent.selfcheck_probe import library_problem

    return library_problem(choice.library) if choice.backend is IsolationBackend.SHIM and choice.library else ""


def _check_node(fake_gpus: str | None, options: ProbeOptions, unloadable: str) -> int:
    """``--check``: probe, print the verdicts, return the exit code (docs/node-agent.md)."""
    from gpupool.nodeagent.selfcheck import exit_code, render

    checks = _probe_and_judge(fake_gpus, options, unloadable)
    for line in render(checks):
        click.echo(line)
    return exit_code(checks)


def _start_checks(fake_gpus: str | None, options: ProbeOptions, exit_on_fail: bool,
                  unloadable: str = "") -> list[Check]:
    """The checks of ``--check``, run at every start: each logged (warn and fail as warnings and
    errors, with what to do); with ``exit_on_fail`` a failed one stops the agent here."""
    from gpupool.nodeagent.selfcheck import Status, exit_code

    log = logging.getLogger("gpupool.nodeagent.selfcheck")
    levels = {Status.OK: logging.INFO, Status.WARN: logging.WARNING, Status.FAIL: logging.ERROR}
    checks = _probe_and_judge(fake_gpus, options, unloadable)
    for check in checks:
        log.log(levels[check.status], "start-up check %s %s: %s%s", check.status.value, check.name, check.detail,
                f" -> {check.hint}" if check.hint else "")
    if exit_on_fail and exit_code(checks):
        failed = ", ".join(c.name for c in checks if c.status is Status.FAIL)
        raise click.ClickException(f"start-up check failed ({failed}); the lines above say what to do "
                                   "(--exit-on-failed-check)")
    return checks


def _start_annotations(cluster: ClusterSettings | None, checks: Sequence[Check]) -> dict[str, str]:
    """What the agent leaves on its Node at start, written in one patch: the cluster settings the
    extender checks it against (docs/cluster-config.md) and the start-up checks' summary."""
    from datetime import UTC, datetime

    from gpupool.api.cluster_settings import AGENT_CHECKS_ANNOTATION, AGENT_SETTINGS_ANNOTATION
    from gpupool.nodeagent.selfcheck import checks_annotation

    annotations = {}
    if cluster is not None:
        annotations[AGENT_SETTINGS_ANNOTATION] = cluster.published()
    if checks:
        annotations[AGENT_CHECKS_ANNOTATION] = checks_annotation(checks, datetime.now(UTC))
    return annotations


def _probe_and_judge(fake_gpus: str | None, options: ProbeOptions, unloadable: str) -> list[Check]:
    """The checks, with the interception library's load verdict ``unloadable`` (:func:`_library_verdict`)."""
    from gpupool.nodeagent.gpu_inventory import GpuInventory
    from gpupool.nodeagent.lending.checkpoint_location import describe as describe_checkpoints
    from gpupool.nodeagent.monitor.cgroup_device_gate import cgroup_device_gate_available
    from gpupool.nodeagent.monitor.source_selector import probe_fanotify
    from gpupool.nodeagent.selfcheck import judge
    from gpupool.nodeagent.selfcheck_probe import probe
    from gpupool.shim.remote_build import server_problem

    def inventory() -> GpuInventory:
        if fake_gpus:
            from gpupool.nodeagent.nvml.fake import FakeGpuBackend
            return FakeGpuBackend.from_file(fake_gpus).inventory()
        from gpupool.nodeagent.nvml.real import NvmlBackend
        backend = NvmlBackend()
        try:
            return backend.inventory()
        finally:
            backend.close()

    return judge(probe(options, inventory, probe_fanotify, describe_checkpoints, server_problem,
                       gate=cgroup_device_gate_available, library=lambda _path: unloadable))


def _remote_options(listen: str | None, endpoint: str | None, state_dir: str,
                    flags: RemoteServerFlags | None = None) -> RemoteGpuOptions | None:
    """The ``--remote-gpu-*`` flags checked (None when the server is off). A server that would refuse
    to start (plain TCP off loopback) is refused here, at the agent's start, not restarted forever."""
    from pathlib import Path

    from gpupool.nodeagent.remote_setup import CLIENTS_FILE, RemoteGpuOptions, host_port
    from gpupool.remotegpu.serve import ListenFlags, RemoteServeError, TlsFiles, check_listen

    flags = flags or RemoteServerFlags()
    if listen is None:
        given = (["--remote-gpu-endpoint"] if endpoint is not None else []) + flags.given()
        if given:
            raise click.BadParameter("needs --remote-gpu-server", param_hint=given[0])
        return None
    if (flags.tls_cert is None) != (flags.tls_key is None):
        raise click.UsageError("--remote-gpu-tls-cert and --remote-gpu-tls-key go together")
    if flags.tls_ca is not None and flags.tls_cert is None:
        raise click.UsageError("--remote-gpu-tls-ca is the CA of the server's TLS certificate: "
                               "give --remote-gpu-tls-cert and --remote-gpu-tls-key too")
    tls = (Path(flags.tls_cert), Path(flags.tls_key)) if flags.tls_cert and flags.tls_key else None
    client_ca = _read_ca(flags.tls_ca) if flags.tls_ca is not None else None
    try:
        listen = host_port(listen, "--remote-gpu-server")
        check_listen(listen, flags.allow_plain, TlsFiles(*tls) if tls is not None else None,
                     ListenFlags("--remote-gpu-server", "--remote-gpu-tls-cert", "--remote-gpu-tls-key",
                                 "--remote-gpu-allow-plain"))
        return RemoteGpuOptions(listen, host_port(endpoint or listen, "--remote-gpu-endpoint"),
                                Path(state_dir) / CLIENTS_FILE, tls=tls, client_ca=client_ca,
                                enforce_compute=flags.enforce_compute, allow_plain=flags.allow_plain)
    except RemoteServeError as exc:
        raise click.BadParameter(str(exc), param_hint="--remote-gpu-server") from None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _read_ca(path: str) -> str:
    """The CA file's PEM text; a file holding no certificate is refused (clients could not use it)."""
    from pathlib import Path

    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path}: cannot read it as PEM ({exc})", param_hint="--remote-gpu-tls-ca") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise click.BadParameter(f"{path}: holds no PEM certificate", param_hint="--remote-gpu-tls-ca")
    return text


def _dra_driver(node: str, domain: str, options: DraOptions, agent: NodeAgent,
                kubeconfig: str | None) -> DraDriver:
    """The DRA driver on the agent's cards and enforcement; a checkpoint it cannot read stops the
    agent with the file named and what to do (docs/dra.md)."""
    from gpupool.nodeagent.dra.checkpoint import CheckpointError
    from gpupool.nodeagent.dra.kube_client import KubeDraClient
    from gpupool.nodeagent.dra.plugin_holdings import plugin_pods
    from gpupool.nodeagent.dra.setup import DraDriver

    client = KubeDraClient(node, kubeconfig)
    try:
        driver = DraDriver(node, domain, options, lambda: agent.inventory, client.read_claim, client,
                           agent.enforcement, held_elsewhere=lambda: plugin_pods(node, agent.listed_pods()))
    except CheckpointError as exc:
        raise click.ClickException(str(exc)) from None
    agent.claims_granted = driver.state.as_pods  # the device plugin's Allocate counts prepared claims
    return driver


HAMI_FAMILY = "hami"


def _hami_from_aliases(flags: ClusterFlags, families: list[str]) -> ClusterFlags:
    """``--serve-aliases hami``, the old way to say ``--hami``: taken as ``--hami`` with a warning; with
    ``--no-hami`` a usage error."""
    if HAMI_FAMILY not in families:
        return flags
    click.echo("warning: --serve-aliases hami is deprecated and will be removed; use --hami", err=True)
    if flags.overrides.get(Setting.HAMI) is False:
        raise click.UsageError("--serve-aliases hami and --no-hami disagree; give only --hami")
    return ClusterFlags(flags.config_map, {**flags.overrides, Setting.HAMI: True})


def _device_gate(monitor: UsageMonitor | None, decider: RiskOpenDecider | None) -> ContainerGate | None:
    """The kernel's refusal at open (cgroup-device programs) where the monitor's probe found it usable:
    the lending rules and ``refuse-opens`` precompute their refusals into it."""
    if monitor is None or not monitor.gate_available:
        return None
    from gpupool.nodeagent.monitor.container_gate import open_container_gate
    from gpupool.nodeagent.risk.setup import gate_blocked
    gate, why = open_container_gate()
    if gate is None:
        logging.getLogger(__name__).warning("device gate not started (%s): refusals only by reclaim", why)
        return None
    if decider is not None:
        gate_blocked(decider, gate, monitor.cards)
    return gate


async def _run(node: str, fake_gpus: str | None, plugin_dir: str, podres: str, kubeconfig: str | None,
               names: ResourceNames, aliases: tuple[str, ...], metrics_port: int,
               monitor_config: MonitorConfig | None, isolation: IsolationConfig,
               heartbeat: HeartbeatSettings | None = None,
               risk: tuple[RiskAction, float, int] = (RiskAction.REPORT, DEFAULT_GRACE_S, DEFAULT_OVERHEAD_MIB),
               lend: LendingOptions | None = None, server_limits: ServerLimits | None = None,
               dra: DraOptions | None = None,
               cluster: ClusterSettings | None = None, remote: RemoteGpuOptions | None = None,
               libraries: DriverLibraries | None = None, start_checks: Sequence[Check] = ()) -> None:
    from gpupool.nodeagent.agent import NodeAgent
    from gpupool.nodeagent.allocated_codec import encode_served
    from gpupool.nodeagent.device_layout import list_and_watch_problem
    from gpupool.nodeagent.deviceplugin.manager import DevicePluginManager
    from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
    from gpupool.nodeagent.gpu_inventory import GpuBackend
    from gpupool.nodeagent.isolation.backends import IsolationConfigError
    from gpupool.nodeagent.isolation.setup import build_enforcement
    from gpupool.nodeagent.kube_pod_source import KubePodSource
    from gpupool.nodeagent.metrics import serve_metrics
    from gpupool.nodeagent.monitor.container_directory import InMemoryContainerDirectory
    from gpupool.nodeagent.monitor.pod_containers import DirectoryFeed
    from gpupool.nodeagent.risk.metrics import RiskCollector
    from gpupool.nodeagent.risk.setup import build_risk, open_decider
    from gpupool.nodeagent.schedule_check import REFUSED_REASON
    from gpupool.nodeagent.usage_monitor import build_monitor, pod_event_listener

    backend: GpuBackend
    if fake_gpus:
        from gpupool.nodeagent.nvml.fake import FakeGpuBackend, FakeGpuFileError
        try:
            backend = FakeGpuBackend.from_file(fake_gpus)
        except FakeGpuFileError as exc:  # the file and field named, not a traceback
            raise click.BadParameter(str(exc), param_hint="--fake-gpus") from None
    else:
        from gpupool.nodeagent.nvml.real import NvmlBackend
        backend = NvmlBackend()
    pods = KubePodSource(names, node, kubeconfig)
    monitor = None
    decider = open_decider(risk[0])
    if monitor_config is not None:
        monitor = build_monitor(node, backend, monitor_config,
                                pod_event_listener(pods.post_event, monitor_config.idle_after),
                                **({"decide": decider} if decider is not None else {}))
        pods.cache.feeds.append(DirectoryFeed(monitor.directory))
        try:
            monitor.start()  # logs which event source runs and why
        except Exception:  # the device plugin is what the node's pods need; run without the monitor
            logging.getLogger(__name__).exception("usage monitor not started; the agent runs without it")
            monitor.stop()
            monitor = None
    async def report_refusal(pod: tuple[str, str], reason: str) -> None:
        await pods.post_event(*pod, REFUSED_REASON, reason, event_type="Warning")

    directory = monitor.directory if monitor is not None else InMemoryContainerDirectory()
    if monitor is None:
        pods.cache.feeds.append(DirectoryFeed(directory))
    try:
        cards = backend.inventory()
        enforcement = build_enforcement(isolation, directory,
                                        {c.index: cards.pci_bus_id(c.index) for c in cards.cards})
    except (IsolationConfigError, OSError) as exc:
        if monitor is not None:
            monitor.stop()
        backend.close()
        raise click.BadParameter(str(exc), param_hint="--isolation") from None
    if libraries is not None:  # plain runc: the grant carries the driver (docs/node-agent.md)
        logging.getLogger(__name__).info("driver libraries for every grant from %s: %s", libraries.source,
                                         ", ".join(sorted(libraries.files)))
        enforcement = DriverLibrariesEnforcement(enforcement, libraries)
    lending = None
    if lend is not None and monitor is not None:
        from gpupool.nodeagent.lending.setup import LendingSetup
        lending = LendingSetup(node, names, lend, kubeconfig)
        pods.cache.feeds.append(lending.pods)
        enforcement = lending.wrap(enforcement)
    choice = isolation.choice()
    agent = NodeAgent(node, names, backend, pods, PodResourcesClient(podres), encode_served, aliases=aliases,
                      monitor=monitor, enforcement=enforcement, report_refusal=report_refusal,
                      shares=choice.shares)
    for resource in agent.resources:  # a list kubelet cannot read would leave the resource unserved
        problem = list_and_watch_problem(agent.layout, resource, agent.inventory)
        if problem is not None:
            raise click.ClickException(problem)
    gate = _device_gate(monitor, decider)
    service = lending.attach(agent, monitor, gate) if lending is not None and monitor is not None else None
    manager = DevicePluginManager(plugin_dir, agent.resources, agent, own_domain=names.domain)
    dra_driver = _dra_driver(node, names.domain, dra, agent, kubeconfig) if dra is not None else None

    async def post_warning(namespace: str, pod: str, reason: str, message: str) -> None:
        await pods.post_event(namespace, pod, reason, message, event_type="Warning")

    checks = (build_risk(risk[0], agent, monitor, post_warning, decider, kubeconfig, risk[1], risk[2],
                         isolation.state_dir) if monitor else None)
    if checks is None:
        logging.getLogger(__name__).warning("risk checks off: they need the usage monitor's holders")
    extra = [RiskCollector(checks)] if checks is not None else []
    metrics = (await serve_metrics(agent, metrics_port, extra=extra, limits=server_limits,
                                   remote_clients=remote.clients_file if remote is not None else None)
               if metrics_port else None)

    async def publish_once_served() -> None:
        """The inventory goes on the Node only once kubelet accepted the device plugins (the
        extender places pods by it; kubelet must be able to grant them), then on every change."""
        await manager.registered.wait()
        version = agent.devices_version
        await pods.publish_node(node, agent.inventory, enforcement_notice(choice, agent.enforcement),
                                foreign_capacity(agent.resources, len(agent.inventory.cards)))
        while True:
            version = await agent.wait_devices_changed(version)
            await pods.publish_node(node, agent.inventory, enforcement_notice(choice, agent.enforcement),
                                    foreign_capacity(agent.resources, len(agent.inventory.cards)))

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(pods.run())  # the watch of this node's pods, first
            group.create_task(manager.run())
            group.create_task(agent.run())
            group.create_task(publish_once_served())
            started_with = _start_annotations(cluster, start_checks)
            if started_with:  # on the Node for the extender (settings) and `kubectl describe node` (checks)
                from gpupool.nodeagent.start_annotations import kube_core_v1, publish_annotations
                group.create_task(publish_annotations(kube_core_v1(node, kubeconfig), node, started_with))
            if dra_driver is not None:
                group.create_task(dra_driver.run(agent.wait_devices_changed, agent.devices_version))
            if checks is not None:
                group.create_task(checks.run())
            if service is not None:
                group.create_task(service.run())
            if remote is not None:  # remote shares booked on this node's cards (docs/remote-gpu.md)
                from gpupool.nodeagent.remote_setup import run_remote_gpu
                from gpupool.nodeagent.start_annotations import kube_core_v1 as core_v1_of
                group.create_task(run_remote_gpu(node, names, remote, core_v1_of(node, kubeconfig)))
            if heartbeat is not None:  # only while registered: a live Lease means a served node
                from gpupool.nodeagent.heartbeat import kube_heartbeat
                group.create_task(kube_heartbeat(node, kubeconfig, heartbeat).run(served=manager.registered))
    finally:
        if metrics is not None:
            await metrics.cleanup()
        if monitor is not None:
            monitor.stop()
        if gate is not None:
            gate.close()
        backend.close()
