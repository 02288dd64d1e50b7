"""``gpupool node-agent``: the device plugin and node agent of one node."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import click

from gpupool.api.cluster_settings import Setting
from gpupool.api.environment import COMPUTE_MODES
from gpupool.api.shim_contract import MAX_RENEW_S
from gpupool.cli import cluster_options
from gpupool.cli.cluster_options import ClusterFlags, cluster_setting_options, describe
from gpupool.cli.old_flags import old_spelling
from gpupool.cli.server_options import server_limit_options
from gpupool.netguard.limits import ServerLimits
from gpupool.nodeagent.assembly import run_agent
from gpupool.nodeagent.dra.setup import DraOptions
from gpupool.nodeagent.driver_libraries import DriverLibraryError
from gpupool.nodeagent.driver_libraries import driver_libraries as find_driver_libraries
from gpupool.nodeagent.heartbeat import HeartbeatSettings
from gpupool.nodeagent.isolation.backends import (
    CHOICES,
    BackendChoice,
    IsolationBackend,
    IsolationConfigError,
    packaged_library,
)
from gpupool.nodeagent.isolation.setup import IsolationConfig
from gpupool.nodeagent.isolation.shim_socket import RegistrationLimits
from gpupool.nodeagent.lending.options import (
    DEFAULT_CHECKPOINT_RETENTION,
    ActivityThresholds,
    LendingOptions,
    parse_retention,
)
from gpupool.nodeagent.monitor.scripted_usage import parse_duration
from gpupool.nodeagent.monitor.service import MonitorConfig
from gpupool.nodeagent.options import HAMI_FAMILY, AgentOptions, AgentOptionsError, RiskOptions
from gpupool.nodeagent.risk.findings import RiskAction
from gpupool.nodeagent.risk.setup import ACTIONS
from gpupool.nodeagent.termination import run_until_terminated

if TYPE_CHECKING:
    from gpupool.nodeagent.remote_setup import RemoteGpuOptions
    from gpupool.nodeagent.selfcheck import Check
    from gpupool.nodeagent.selfcheck_probe import ProbeOptions

SHIPPED = AgentOptions(node="")
"""The agent the command runs without flags: every flag's default is read from it (the node name
aside, which comes from the environment)."""
_MONITOR = SHIPPED.monitor or MonitorConfig()
_ISOLATION = SHIPPED.isolation
_LENDING = LendingOptions()
_DRA = DraOptions()


def _duration(value: str, option: str = "--idle-after") -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None
    if seconds <= 0:
        raise click.BadParameter("must be longer than 0 s", param_hint=option)
    return seconds


def _names(value: str) -> tuple[str, ...]:
    """A comma-separated option's names, blanks around them dropped; "" is none."""
    return tuple(n.strip() for n in value.split(",") if n.strip())


@click.command("node-agent")
@click.option("--node-name", default=lambda: os.environ.get("NODE_NAME", socket.gethostname()),
              show_default="$NODE_NAME or hostname", help="This node's name in Kubernetes.")
@click.option("--fake-gpus", type=click.Path(exists=True, dir_okay=False),
              help="Describe GPUs with a YAML file instead of NVML (see docs/node-agent.md).")
@click.option("--plugin-dir", default=SHIPPED.plugin_dir, show_default=True)
@click.option("--pod-resources-socket", default=SHIPPED.pod_resources_socket, show_default=True)
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="Default: in-cluster, then ~/.kube.")
@click.option("--serve-aliases", default="", metavar="FAMILIES",
              help="Also serve these foreign resource families, comma-separated: gpushare "
                   "(aliyun.com/gpu-mem), gpumanager (tencent.com/vcuda-core, vcuda-memory). For nodes "
                   "that take over from those device plugins (docs/node-agent.md). HAMi's names: --hami "
                   "(\"hami\" here still works, deprecated).")
@click.option("--metrics-port", default=SHIPPED.metrics_port, show_default=True,
              type=click.IntRange(0, 65535),
              help="Serve this node's per-card metrics on this port (GET /metrics); 0: none.")
@click.option("--usage-monitor/--no-usage-monitor", default=SHIPPED.monitor is not None, show_default=True,
              help="Watch opens of the GPU device files, sample usage, mark idle cards (docs/monitor.md).")
@click.option("--usage-state-file", default=_MONITOR.state_path, show_default=True,
              type=click.Path(dir_okay=False), help="The usage monitor's state file (on a hostPath).")
@click.option("--idle-after", default=f"{_MONITOR.idle_after / 60:g}m", show_default=True,
              metavar="DURATION", help="A held card without SM activity this long is idle (e.g. 90s, 10m, 1h).")
@click.option("--infrastructure-holders", default=",".join(_MONITOR.infrastructure), show_default=True,
              metavar="NAMES",
              help="Host daemons (in no pod; matched by the file /proc/<pid>/exe names) whose open device files "
                   "neither make a card busy nor keep it from being lent, comma-separated; \"\": none "
                   "(docs/monitor.md, \"Infrastructure holders\").")
@click.option("--infrastructure-namespaces", default=",".join(_MONITOR.infrastructure_namespaces), show_default=True,
              metavar="NAMESPACES",
              help="Namespaces where GPU infrastructure runs as pods (e.g. gpu-operator: the DCGM exporter, the "
                   "driver container), comma-separated: a process of a pod there that asked for no GPU (gpupool's "
                   "or another device plugin's, such as nvidia.com/gpu) is an infrastructure holder. Only list "
                   "namespaces where tenants cannot create pods; \"\": none (docs/monitor.md, \"Infrastructure "
                   "pods\").")
@click.option("--isolation", type=click.Choice(CHOICES), default=_ISOLATION.requested, show_default=True,
              help="What enforces the shares: shim (the interception library), mps (the agent runs the MPS "
                   "control daemon), none; auto: shim with --shim-library, else none (docs/isolation-backends.md).")
@click.option("--shim-library", type=click.Path(exists=True, dir_okay=False), default=_ISOLATION.shim_library,
              help="The interception library to mount into containers (`gpupool shim path` prints it).")
@click.option("--driver-libraries", default="none", show_default=True, metavar="none|host|DIR",
              help="Mount the NVIDIA driver's user-space libraries into GPU containers and set LD_LIBRARY_PATH, "
                   "so GPU pods run under plain runc: host (found as the NVIDIA container toolkit finds them, "
                   "ldconfig -p) or a directory holding them (docs/node-agent.md).")
@click.option("--compute-mode", type=click.Choice(COMPUTE_MODES), default=_ISOLATION.compute_mode, show_default=True,
              help="hard: never above the compute share; soft: above it while the card is otherwise idle.")
@click.option("--state-dir", default=_ISOLATION.state_dir, show_default=True, type=click.Path(file_okay=False),
              help="Per-container directories, the registration socket and the MPS directories live here.")
@click.option("--mps-control", default=_ISOLATION.mps_control, show_default=True,
              help="The MPS control daemon binary (--isolation mps).")
@click.option("--cgroup-root", default=_ISOLATION.cgroup_root, show_default=True, type=click.Path(file_okay=False),
              help="The host's cgroup v2 root, where dmem.max limits are written when the kernel has the dmem "
                   "controller (docs/isolation-backends.md).")
@click.option("--agent-lease-duration", "lease_duration", default=SHIPPED.lease_duration_s, show_default=True,
              type=click.IntRange(min=1),
              help="Seconds the extender waits after the last renewal before it stops placing GPU pods here.")
@click.option("--agent-lease-renew-interval", "lease_renew_interval", default=SHIPPED.lease_renew_interval_s,
              show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds between renewals of the heartbeat Lease.")
@click.option("--risk-action", type=click.Choice(ACTIONS), default=SHIPPED.risk.action.value, show_default=True,
              help="What to do about a process on a card outside its grant (docs/security.md, \"Risk detection\"): "
                   "report (event and metric), refuse-opens, evict (the pod), cordon-card. Needs the usage monitor.")
@click.option("--risk-grace", default=f"{SHIPPED.risk.grace_s:g}s", show_default=True, metavar="DURATION",
              help="A holder is judged only after holding its card this long.")
@click.option("--risk-memory-tolerance", default=SHIPPED.risk.memory_tolerance_mib, show_default=True,
              type=click.IntRange(min=0),
              metavar="MIB", help="Driver memory (CUDA context, module code) allowed per process above a container's "
                                  "grant before the over-grant backstop reports it (docs/security.md).")
@click.option("--lending/--no-lending", default=SHIPPED.lending is not None, show_default=True,
              help="Lend idle cards to waiting pods and apply the priority rules at every open (docs/lending.md).")
@click.option("--checkpoint-dir", default=_LENDING.checkpoint_root, show_default=True,
              type=click.Path(file_okay=False), help="Per-task checkpoint directories (--lending; a hostPath).")
@click.option("--checkpoint-deadline", default=_LENDING.deadline_s, show_default=True,
              type=click.FloatRange(min=0), help="Seconds a reclaimed task has to write its checkpoint (--lending).")
@click.option("--owner-active-percent", default=_LENDING.activity.percent, show_default=True,
              type=click.IntRange(1, 100),
              help="A lent card's owner computing at least this SM share is back (--lending; docs/lending.md).")
@click.option("--owner-active-memory", default=_LENDING.activity.memory_mib, show_default=True,
              type=click.IntRange(min=1), metavar="MIB", help="... or holding this much more memory than while lent.")
@click.option("--owner-active-samples", default=_LENDING.activity.samples, show_default=True,
              type=click.IntRange(min=1),
              help="... in this many usage samples in a row; then its loan ends as if it opened the card.")
@click.option("--cuda-checkpoint-timeout", default=_LENDING.cuda_checkpoint_timeout_s, show_default=True,
              type=click.FloatRange(min=0), help="Seconds cuda-checkpoint may take to suspend what outlives the "
              "checkpoint deadline before it is killed (--lending; 0: never run it).")
@click.option("--criu", default=None, type=click.Path(dir_okay=False, exists=True), metavar="PATH",
              help="A statically linked CRIU 4: pods annotated gpupool.io/checkpoint: process get it and criu-run "
                   "mounted at /var/run/gpupool/criu (--lending; docs/lending.md, Process checkpoints with CRIU).")
@click.option("--criu-dir", default=_LENDING.criu_tools_dir, show_default=True, type=click.Path(file_okay=False),
              help="Host directory the agent fills with CRIU, criu-run and CRIU's kernel cache for those pods (--criu; "
                   "a tmpfs keeps the cache, with which they need only the CHECKPOINT_RESTORE capability).")
@click.option("--checkpoint-retention", default=DEFAULT_CHECKPOINT_RETENTION, show_default=True, metavar="DURATION",
              help="A task's checkpoint directory whose newest change is older than this (e.g. 7d, 12h, seconds) is "
                   "removed, unless a pod on this node has it (--lending; 0: never; docs/lending.md).")
@click.option("--registration-timeout", default=_ISOLATION.registration.read_timeout_s, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds a connection to the registration socket has to send its request line "
                   "(the library sends it at once; docs/security.md, Bounded servers).")
@click.option("--registration-max-connections", default=_ISOLATION.registration.max_connections, show_default=True,
              type=click.IntRange(min=1),
              help="Connections the registration socket holds at once; past it a new one replaces the oldest "
                   "silent one.")
@click.option("--registration-heartbeat", default=_ISOLATION.registration.heartbeat_s, show_default=True,
              type=click.IntRange(1, MAX_RENEW_S),
              help="Seconds between the interception library's renewals of its registration (the container's "
                   "heartbeat); a process holding a card that has not renewed for 3 of them is a stale-heartbeat "
                   "risk (docs/isolation.md, Heartbeat).")
@click.option("--dra/--no-dra", default=SHIPPED.dra is not None, show_default=True,
              help="Also be a DRA driver (gpu.<domain>): publish this node's ResourceSlice and prepare "
                   "ResourceClaims through kubelet's DRA plugin API (docs/dra.md).")
@click.option("--dra-kubelet-dir", default=_DRA.kubelet_dir, show_default=True, type=click.Path(file_okay=False),
              help="kubelet's root directory as the agent sees it (--dra registers in its plugins_registry).")
@click.option("--cdi-dir", default=_DRA.cdi_dir, show_default=True, type=click.Path(file_okay=False),
              help="Where --dra writes one CDI spec per prepared claim (the container runtime reads it).")
@click.option("--dra-checkpoint", default=_DRA.checkpoint, type=click.Path(dir_okay=False),
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
@click.option("--remote-gpu-tls-from-cluster", is_flag=True,
              help="Serve TLS with this node's own certificate, asked of the cluster's signer "
                   "(gpupool.io/remote-gpu-server, the extender's --remote-gpu-signer) for the node's name and "
                   "the --remote-gpu-endpoint IP; the key is made on the node and never leaves it; renewed "
                   "after two thirds of its life. Instead of --remote-gpu-tls-cert/-key.")
@click.option("--remote-gpu-enforce-compute", is_flag=True,
              help="Hold each remote client to its compute share (its calls run under the interception library).")
@click.option("--remote-gpu-allow-plain", is_flag=True,
              help="Serve remote clients plain TCP off loopback (tokens and data cross the network in the clear).")
@click.option("--remote-gpu-cublas", default=None, type=click.Path(dir_okay=False), metavar="PATH",
              help="NVIDIA's libcublas.so.12 (libcublasLt.so.12 beside it) on which --remote-gpu-server runs the "
                   "clients' cuBLAS calls (its --cublas). Default: the server looks for one "
                   "(docs/remote-gpu.md, \"cuBLAS\").")
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
               metrics_port: int, usage_monitor: bool, usage_state_file: str, idle_after: str,
               infrastructure_holders: str, infrastructure_namespaces: str, isolation: str,
               shim_library: str | None, driver_libraries: str, compute_mode: str, state_dir: str, mps_control: str,
               cgroup_root: str,
               lease_duration: int, lease_renew_interval: float, risk_action: str,
               risk_grace: str, risk_memory_tolerance: int, lending: bool,
               checkpoint_dir: str, checkpoint_deadline: float, owner_active_percent: int, owner_active_memory: int,
               owner_active_samples: int, cuda_checkpoint_timeout: float, criu: str | None, criu_dir: str,
               checkpoint_retention: str, registration_timeout: float,
               registration_max_connections: int, registration_heartbeat: int, dra: bool, dra_kubelet_dir: str,
               cdi_dir: str,
               dra_checkpoint: str | None, remote_listen: str | None, remote_gpu_endpoint: str | None,
               remote_gpu_tls_cert: str | None, remote_gpu_tls_key: str | None, remote_gpu_tls_ca: str | None,
               remote_gpu_tls_from_cluster: bool, remote_gpu_enforce_compute: bool, remote_gpu_allow_plain: bool,
               remote_gpu_cublas: str | None,
               check_only: bool,
               exit_on_failed_check: bool, verbose: bool, server_limits: ServerLimits,
               cluster_flags: ClusterFlags) -> None:
    """Serve gpupool's kubelet device plugins and keep this node's GPU annotations current."""
    from gpupool.api.names import alias_family_resources

    families = [f.strip() for f in serve_aliases.split(",") if f.strip()]
    cluster_flags = _hami_from_aliases(cluster_flags, families)
    alias_families = tuple(f for f in families if f != HAMI_FAMILY)
    try:
        alias_family_resources(alias_families)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--serve-aliases") from None
    try:
        monitor = MonitorConfig(usage_state_file, _duration(idle_after), infrastructure=_names(infrastructure_holders),
                                infrastructure_namespaces=_names(infrastructure_namespaces)) if usage_monitor else None
    except ValueError as exc:
        hint = ("--infrastructure-namespaces" if str(exc).startswith("infrastructure namespace")
                else "--infrastructure-holders")
        raise click.BadParameter(str(exc), param_hint=hint) from None
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
    activity = ActivityThresholds(owner_active_percent, owner_active_memory, owner_active_samples)
    try:
        retention_s = parse_retention(checkpoint_retention)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--checkpoint-retention") from None
    lend = LendingOptions(checkpoint_dir, checkpoint_deadline, cluster.high_priority_threshold, activity,
                          cuda_checkpoint_timeout, state_dir, criu=criu, criu_tools_dir=criu_dir,
                          checkpoint_retention_s=retention_s) if lending else None
    remote = _remote_options(remote_listen, remote_gpu_endpoint, state_dir,
                             RemoteServerFlags(remote_gpu_tls_cert, remote_gpu_tls_key, remote_gpu_tls_ca,
                                               remote_gpu_enforce_compute, remote_gpu_allow_plain,
                                               remote_gpu_tls_from_cluster, remote_gpu_cublas))
    try:
        options = AgentOptions(
            node_name, fake_gpus=fake_gpus, plugin_dir=plugin_dir, pod_resources_socket=pod_resources_socket,
            kubeconfig=kubeconfig, cluster=cluster, alias_families=alias_families, metrics_port=metrics_port,
            monitor=monitor, isolation=isolation_config, lease_duration_s=lease_duration,
            lease_renew_interval_s=lease_renew_interval,
            risk=RiskOptions(RiskAction(risk_action), _duration(risk_grace, "--risk-grace"), risk_memory_tolerance),
            lending=lend, dra=DraOptions(dra_kubelet_dir, cdi_dir, dra_checkpoint) if dra else None, remote=remote,
            server_limits=server_limits, libraries=libraries, start_checks=tuple(start_checks))
    except AgentOptionsError as exc:
        raise click.BadParameter(str(exc), param_hint=exc.option) from None
    try:
        asyncio.run(run_until_terminated(run_agent(options)))  # SIGTERM cleans up as Ctrl-C does
    except AgentOptionsError as exc:  # a part that cannot be built: its flag named, not a traceback
        if exc.option is None:
            raise click.ClickException(str(exc)) from None
        raise click.BadParameter(str(exc), param_hint=exc.option) from None


@dataclass(frozen=True)
class RemoteServerFlags:
    """The ``--remote-gpu-*`` flags that shape the server the agent runs."""

    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    enforce_compute: bool = False
    allow_plain: bool = False
    tls_from_cluster: bool = False
    cublas: str | None = None

    def given(self) -> list[str]:
        """The flags set, spelled as on the command line."""
        return [flag for flag, value in (("--remote-gpu-tls-cert", self.tls_cert),
                                         ("--remote-gpu-tls-key", self.tls_key), ("--remote-gpu-tls-ca", self.tls_ca),
                                         ("--remote-gpu-tls-from-cluster", self.tls_from_cluster),
                                         ("--remote-gpu-enforce-compute", self.enforce_compute),
                                         ("--remote-gpu-allow-plain", self.allow_plain),
                                         ("--remote-gpu-cublas", self.cublas)) if value]


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


def _probe_and_judge(fake_gpus: str | None, options: ProbeOptions, unloadable: str) -> list[Check]:
    """The checks, with the interception library's load verdict ``unloadable`` (:func:`_library_verdict`)."""
    from gpupool.nodeagent.gpu_inventory import GpuInventory
    from gpupool.nodeagent.lending.checkpoint_location import describe as describe_checkpoints
    from gpupool.nodeagent.linux.cgroup_device_gate import cgroup_device_gate_available
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
    if flags.tls_from_cluster:
        return _own_certificate_options(listen, endpoint, state_dir, flags)
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
                                enforce_compute=flags.enforce_compute, allow_plain=flags.allow_plain,
                                cublas=flags.cublas)
    except RemoteServeError as exc:
        raise click.BadParameter(str(exc), param_hint="--remote-gpu-server") from None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _own_certificate_options(listen: str, endpoint: str | None, state_dir: str,
                             flags: RemoteServerFlags) -> RemoteGpuOptions:
    """``--remote-gpu-tls-from-cluster``: TLS with the node's own certificate for the endpoint's IP."""
    import ipaddress
    from pathlib import Path

    from gpupool.nodeagent.remote_setup import CLIENTS_FILE, RemoteGpuOptions, host_port

    if flags.tls_cert is not None:
        raise click.UsageError("--remote-gpu-tls-from-cluster asks for the node's certificate: "
                               "give it or --remote-gpu-tls-cert/--remote-gpu-tls-key, not both")
    try:
        listen = host_port(listen, "--remote-gpu-server")
        dialled = host_port(endpoint or listen, "--remote-gpu-endpoint")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    host = dialled.rpartition(":")[0].strip("[]")
    try:
        address = str(ipaddress.ip_address(host))
    except ValueError:
        raise click.BadParameter(f"{dialled}: the node's certificate names the IP clients dial; give "
                                 "--remote-gpu-endpoint IP:PORT (the chart and kustomize give $(HOST_IP))",
                                 param_hint="--remote-gpu-endpoint") from None
    return RemoteGpuOptions(listen, dialled, Path(state_dir) / CLIENTS_FILE,
                            client_ca=_read_ca(flags.tls_ca) if flags.tls_ca is not None else None,
                            enforce_compute=flags.enforce_compute, allow_plain=flags.allow_plain,
                            own_certificate=(address,), cublas=flags.cublas)


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


def _hami_from_aliases(flags: ClusterFlags, families: list[str]) -> ClusterFlags:
    """``--serve-aliases hami``, the old way to say ``--hami``: taken as ``--hami`` with a warning; with
    ``--no-hami`` a usage error."""
    if HAMI_FAMILY not in families:
        return flags
    click.echo("warning: --serve-aliases hami is deprecated and will be removed; use --hami", err=True)
    if flags.overrides.get(Setting.HAMI) is False:
        raise click.UsageError("--serve-aliases hami and --no-hami disagree; give only --hami")
    return ClusterFlags(flags.config_map, {**flags.overrides, Setting.HAMI: True})
