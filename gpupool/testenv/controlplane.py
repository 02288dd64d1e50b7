"""etcd + kube-apiserver + kube-scheduler on loopback, started and stopped as one unit.

There is no kube-controller-manager unless a test asks for one: tests see exactly the API behaviour
they cause (no garbage collector, no node lifecycle taints, no service-account tokens). Two admission
plugins that would wait for such a controller are disabled (``ServiceAccount``,
``TaintNodesByCondition``). A test that needs a workload's controller starts a few controllers for
its own duration (:meth:`ControlPlane.start_controllers`, :mod:`gpupool.testenv.controllers`).

Every port is picked free at start, so several control planes (parallel sessions, a developer's
own) coexist; a start that loses a port race is retried with fresh ports.

The apiserver audits the requests of one extra identity (:mod:`gpupool.testenv.audit`): a test
that runs a component with :attr:`ControlPlane.audited_kubeconfig` can count every request it made.
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.testenv.audit import AUDITED_USER, audit_args, render_audit_policy
from gpupool.testenv.build import ensure_binaries
from gpupool.testenv.config import (
    SERVICE_CLUSTER_IP_RANGE,
    ExtenderConfig,
    render_kubeconfig,
    render_scheduler_config,
    render_token_file,
)
from gpupool.testenv.controllers import DEFAULT_CONTROLLERS, start_controller_manager
from gpupool.testenv.errors import StartupError
from gpupool.testenv.healthz_start import START_ATTEMPTS, start_with_healthz
from gpupool.testenv.paths import Binaries
from gpupool.testenv.pki import Pki, make_pki
from gpupool.testenv.ports import free_ports
from gpupool.testenv.probe import http_get, is_ok
from gpupool.testenv.procs import ManagedProcess, spawn, wait_until

#: Admission plugins that need a controller this environment does not run.
DISABLED_ADMISSION_PLUGINS = ("ServiceAccount", "TaintNodesByCondition")


# kube-apiserver stops listening at once on SIGTERM but then lingers while clients hold watches open
# (long after the test is done when a scheduler is connected). Its state is in etcd, so after a
# short grace period SIGKILL is safe and keeps teardown and restart_apiserver() fast.
_APISERVER_STOP_TIMEOUT = 3.0


@dataclass
class ControlPlane:
    """A running control plane; use as a context manager or call :meth:`stop`."""

    state_dir: Path
    server: str
    token: str
    ca_cert: Path
    kubeconfig: Path
    binaries: Binaries
    etcd: ManagedProcess
    apiserver: ManagedProcess
    scheduler: ManagedProcess | None
    extenders: tuple[ExtenderConfig, ...] = ()
    etcd_url: str = ""
    remove_state_on_stop: bool = True
    controller_manager: ManagedProcess | None = None
    """Running while a test asked for controllers (:meth:`start_controllers`)."""
    _stopped: bool = field(default=False, repr=False)

    @property
    def audited_kubeconfig(self) -> Path:
        """A kubeconfig whose requests the apiserver writes to :attr:`audit_log` (and no others')."""
        return self.state_dir / "kubeconfig-audited"

    @property
    def audit_log(self) -> Path:
        """The requests made with :attr:`audited_kubeconfig` (read with ``read_audit_log``)."""
        return _audit_log(self.state_dir)

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def processes(self) -> list[ManagedProcess]:
        """The running components, in start order."""
        procs = [self.etcd, self.apiserver]
        if self.scheduler is not None:
            procs.append(self.scheduler)
        if self.controller_manager is not None:
            procs.append(self.controller_manager)
        return procs

    def start_controllers(self, controllers: Sequence[str] = DEFAULT_CONTROLLERS, timeout: float = 60.0) -> None:
        """Run kube-controller-manager with ``controllers`` (default: Deployments and ReplicaSets)
        until :meth:`stop_controllers`; one already running is replaced."""
        self.stop_controllers()
        self.controller_manager = start_controller_manager(self.binaries, self.state_dir, self.kubeconfig,
                                                           controllers, timeout=timeout)

    def stop_controllers(self) -> None:
        """Stop the controller-manager, if one runs: the objects it made stay, nobody reconciles them."""
        if self.controller_manager is not None:
            self.controller_manager.stop()
            self.controller_manager = None

    def restart_scheduler(self, extenders: Sequence[ExtenderConfig] = (), timeout: float = 30.0) -> None:
        """Replace the scheduler by one configured with ``extenders`` (e.g. a test's extender URL).

        Restarting only the scheduler takes about a second, against several for the whole plane.
        """
        if self.scheduler is not None:
            self.scheduler.stop()
        self.scheduler = _start_scheduler(self.binaries, self.state_dir, self.kubeconfig, extenders,
                                          timeout=timeout)
        self.extenders = tuple(extenders)

    def restart_apiserver(self, timeout: float = 60.0) -> None:
        """Restart kube-apiserver on the same port, etcd and certificates (data survives).

        The new apiserver starts its watch caches afresh, so a client resuming a watch from a
        resourceVersion older than the restart gets 410 Gone and must relist: the recovery path
        the extender and node agent need to handle after a control-plane upgrade.
        """
        self.apiserver.stop(timeout=_APISERVER_STOP_TIMEOUT)
        port = int(self.server.rsplit(":", 1)[1])
        pki = Pki.in_dir(self.ca_cert.parent)
        self.apiserver = _start_apiserver(self.binaries, self.state_dir, pki.server_cert, pki.server_key,
                                          pki.service_account_key, self.etcd_url, port)
        _wait_apiserver_ready(self.server, self.token, self.ca_cert, timeout, [self.etcd, self.apiserver])

    def stop(self) -> None:
        """Stop scheduler, apiserver, then etcd (the apiserver hangs retrying a dead etcd)."""
        if self._stopped:
            return
        for proc in reversed(self.processes()):
            proc.stop(timeout=_APISERVER_STOP_TIMEOUT if proc is self.apiserver else 15.0)
        self._stopped = True
        if self.remove_state_on_stop:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def to_record(self) -> dict[str, Any]:
        """A JSON-serialisable description, so another process can stop this plane."""
        return {
            "state_dir": str(self.state_dir), "server": self.server, "token": self.token,
            "ca_cert": str(self.ca_cert), "kubeconfig": str(self.kubeconfig),
            "etcd_url": self.etcd_url,
            "processes": [p.to_record() for p in self.processes()],
        }


def stop_recorded(record: dict[str, Any]) -> None:
    """Stop the processes of a :meth:`ControlPlane.to_record` record, newest first."""
    for proc_record in reversed(record["processes"]):
        proc = ManagedProcess.from_record(proc_record)
        proc.stop(timeout=_APISERVER_STOP_TIMEOUT if proc.name == "kube-apiserver" else 15.0)


def new_state_dir(prefix: str = "gpupool-testenv-") -> Path:
    """A fresh, private directory under /tmp for one run's files."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def start_control_plane(
    binaries: Binaries | None = None,
    *,
    state_dir: Path | None = None,
    extenders: Sequence[ExtenderConfig] = (),
    with_scheduler: bool = True,
    controllers: Sequence[str] = (),
    timeout: float = 60.0,
) -> ControlPlane:
    """Start etcd, kube-apiserver and (unless ``with_scheduler`` is false) kube-scheduler, and
    kube-controller-manager with ``controllers`` when any are named.

    Returns once the apiserver reports ready, the ``default`` namespace exists and the scheduler
    answers its health check. Builds the binaries first when the cache lacks them. On failure
    everything already started is stopped and :class:`StartupError` names the failing log.
    """
    binaries = binaries or ensure_binaries()
    state_dir = state_dir or new_state_dir()
    state_dir.mkdir(parents=True, exist_ok=True)
    pki = make_pki(state_dir / "pki")
    token, audited_token = secrets.token_hex(16), secrets.token_hex(16)
    (state_dir / "tokens.csv").write_text(render_token_file(token) + render_token_file(
        audited_token, user=AUDITED_USER, uid=f"{AUDITED_USER}-uid"))
    (state_dir / "audit-policy.yaml").write_text(render_audit_policy())
    last_error: StartupError | None = None
    for _ in range(START_ATTEMPTS):
        try:
            plane = _start_once(binaries, state_dir, pki, token, extenders, with_scheduler, timeout)
            plane.audited_kubeconfig.write_text(render_kubeconfig(plane.server, audited_token,
                                                                  pki.ca_cert.read_bytes()))
        except StartupError as exc:  # most often a port taken between picking and binding
            last_error = exc
            shutil.rmtree(state_dir / "etcd", ignore_errors=True)
            continue
        if controllers:
            try:
                plane.start_controllers(controllers, timeout=timeout)
            except BaseException:
                plane.stop()
                raise
        (state_dir / "controlplane.json").write_text(json.dumps(plane.to_record(), indent=2))
        return plane
    assert last_error is not None
    raise last_error


def _start_once(binaries: Binaries, state_dir: Path, pki: Pki, token: str,
                extenders: Sequence[ExtenderConfig], with_scheduler: bool, timeout: float) -> ControlPlane:
    """One start attempt with fresh ports; stops what it started if any step fails."""
    started: list[ManagedProcess] = []
    try:
        etcd_port, etcd_peer_port, api_port = free_ports(3)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        etcd = _start_etcd(binaries, state_dir, etcd_port, etcd_peer_port, timeout)
        started.append(etcd)
        server = f"https://127.0.0.1:{api_port}"
        apiserver = _start_apiserver(binaries, state_dir, pki.server_cert, pki.server_key,
                                     pki.service_account_key, etcd_url, api_port)
        started.append(apiserver)
        _wait_apiserver_ready(server, token, pki.ca_cert, timeout, [etcd, apiserver])
        kubeconfig = state_dir / "kubeconfig"
        kubeconfig.write_text(render_kubeconfig(server, token, pki.ca_cert.read_bytes()))
        scheduler = None
        if with_scheduler:
            scheduler = _start_scheduler(binaries, state_dir, kubeconfig, extenders, timeout=timeout)
        return ControlPlane(state_dir=state_dir, server=server, token=token, ca_cert=pki.ca_cert,
                            kubeconfig=kubeconfig, binaries=binaries, etcd=etcd, apiserver=apiserver,
                            scheduler=scheduler, extenders=tuple(extenders), etcd_url=etcd_url)
    except BaseException:
        for proc in reversed(started):
            proc.stop()
        raise


def _wait_apiserver_ready(server: str, token: str, ca_cert: Path, timeout: float,
                          watch: Sequence[ManagedProcess]) -> None:
    """Wait for /readyz and for the ``default`` namespace (created by a post-start hook)."""
    wait_until(lambda: is_ok(f"{server}/readyz", token=token, ca_cert=ca_cert),
               what="kube-apiserver /readyz", timeout=timeout, watch=watch)
    wait_until(lambda: http_get(f"{server}/api/v1/namespaces/default", token=token,
                                ca_cert=ca_cert)[0] == 200,
               what="the default namespace", timeout=timeout, watch=watch)


def _start_etcd(binaries: Binaries, state_dir: Path, port: int, peer_port: int,
                timeout: float) -> ManagedProcess:
    client = f"http://127.0.0.1:{port}"
    peer = f"http://127.0.0.1:{peer_port}"
    etcd = spawn("etcd", [
        binaries.etcd, "--name=gpupool-testenv", f"--data-dir={state_dir / 'etcd'}",
        f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=gpupool-testenv={peer}", "--initial-cluster-state=new",
        "--log-level=warn",
    ], state_dir / "logs" / "etcd.log")
    wait_until(lambda: '"true"' in http_get(f"{client}/health")[1], what="etcd /health",
               timeout=timeout, watch=[etcd])
    return etcd


def apiserver_args(*, etcd_url: str, port: int, cert: Path, key: Path, sa_key: Path,
                   token_file: Path, cert_dir: Path, audit_policy: Path | None = None,
                   audit_log: Path | None = None) -> list[str]:
    """kube-apiserver's flags (without the binary); a pure function for tests and docs."""
    audit = audit_args(audit_policy, audit_log) if audit_policy and audit_log else []
    return [
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1", f"--secure-port={port}",
        f"--cert-dir={cert_dir}", f"--tls-cert-file={cert}", f"--tls-private-key-file={key}",
        f"--token-auth-file={token_file}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        f"--disable-admission-plugins={','.join(DISABLED_ADMISSION_PLUGINS)}",
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
        "--v=1",
        *audit,
    ]


def _start_apiserver(binaries: Binaries, state_dir: Path, cert: Path, key: Path, sa_key: Path,
                     etcd_url: str, port: int) -> ManagedProcess:
    args = apiserver_args(etcd_url=etcd_url, port=port, cert=cert, key=key, sa_key=sa_key,
                          token_file=state_dir / "tokens.csv", cert_dir=state_dir / "pki",
                          audit_policy=state_dir / "audit-policy.yaml", audit_log=_audit_log(state_dir))
    return spawn("kube-apiserver", [binaries.kube_apiserver, *args],
                 state_dir / "logs" / "kube-apiserver.log")


def _audit_log(state_dir: Path) -> Path:
    return state_dir / "logs" / "audit.log"


def scheduler_args(*, config: Path, kubeconfig: Path, port: int) -> list[str]:
    """kube-scheduler's flags (without the binary): its configuration, and health and metrics on
    the loopback secure port ``port``. Requests are authenticated and authorized through the
    apiserver (``--authentication-kubeconfig``/``--authorization-kubeconfig``), so a client with the
    admin token may read ``/metrics``; ``/healthz`` needs no credentials."""
    return [
        f"--config={config}", "--bind-address=127.0.0.1", f"--secure-port={port}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--v=2",
    ]


def _start_scheduler(binaries: Binaries, state_dir: Path, kubeconfig: Path,
                     extenders: Sequence[ExtenderConfig], *, timeout: float) -> ManagedProcess:
    def start(healthz_port: int) -> ManagedProcess:
        config = state_dir / "kube-scheduler.yaml"
        config.write_text(render_scheduler_config(str(kubeconfig), extenders))
        return spawn("kube-scheduler", [
            binaries.kube_scheduler, *scheduler_args(config=config, kubeconfig=kubeconfig, port=healthz_port),
        ], state_dir / "logs" / "kube-scheduler.log")

    return start_with_healthz("kube-scheduler", start, timeout)
