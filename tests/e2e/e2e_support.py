"""Helpers shared by the end-to-end tests: pod manifests, polling, and gpupool's own processes.

``ExtenderProcess`` and ``NodeAgentProcess`` run ``gpupool extender`` / ``gpupool node-agent`` as
child processes, exactly as deployed (the CLI, a kubeconfig, flags), so a test can kill and restart
them and their logs land in a file the failure message names.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.testenv.kubelet import Kubelet

T = TypeVar("T")

#: ``make_node(name=None, allocatable=None, labels=None) -> node name`` (fixture ``make_node``).
MakeNode = Callable[..., str]
#: ``start_kubelet(node_name, labels=None, extra_config=None) -> Kubelet`` (fixture ``start_kubelet``).
StartKubelet = Callable[..., Kubelet]

#: A scheduler name nobody serves: pods with it stay unscheduled until a test binds them.
NO_SCHEDULER = "gpupool-e2e-nobody"


def pod_manifest(
    name: str,
    *,
    limits: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    node_name: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    scheduler_name: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A one-container pod; extended resources go in ``limits`` (requests default to them)."""
    container: dict[str, Any] = {"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"]}
    if limits:
        container["resources"] = {"limits": dict(limits)}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 1}
    if node_name:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": dict(labels or {})}, "spec": spec}


def wait_for(probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.2,
             explain: Callable[[], str] | None = None) -> T:
    """Poll ``probe`` until it returns something other than ``None``/``False``; return that.

    ``explain`` is asked, only on a time-out, for the state that says why (a wait that fails once in
    a loaded CI run cannot be rerun with more logging)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            why = ""
            if explain is not None:
                try:
                    why = "\n" + explain()
                except Exception as exc:  # the explanation must not hide the time-out
                    why = f"\n(explaining failed: {exc!r})"
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{why}")
        time.sleep(interval)


def pod_gone(core_v1: client.CoreV1Api, namespace: str, name: str) -> bool:
    """Whether the apiserver answers 404 for the pod (deleted, not merely terminating)."""
    try:
        core_v1.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        return exc.status == 404
    return False


def condition(obj: Any, kind: str) -> Any:
    """The status condition of type ``kind`` of a client model object, or ``None``."""
    for cond in obj.status.conditions or []:
        if cond.type == kind:
            return cond
    return None


REPO = Path(__file__).resolve().parents[2]
#: ``python -c ...`` that runs the ``gpupool`` CLI of this checkout (PYTHONPATH points at REPO).
GPUPOOL_CLI = [sys.executable, "-c", "from gpupool.cli.main import main; main()"]


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def log_tail(path: Path, chars: int = 3000) -> str:
    """The end of a log file, for failure messages."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"(no log at {path})"


class ExtenderProcess:
    """``gpupool extender`` as a child process; can be killed (SIGKILL) and started again."""

    def __init__(self, kubeconfig: Path, log_path: Path, policy: str = "binpack",
                 extra_args: tuple[str, ...] = ()) -> None:
        self.kubeconfig = kubeconfig
        self.port = free_port()
        self.log_path = log_path
        self.policy = policy
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ready_url(self) -> str:
        """Where ``/readyz`` answers (a TLS extender serves it on its plain health port)."""
        return f"{self.url}/readyz"

    @property
    def metrics_url(self) -> str:
        """Where ``/metrics`` answers (a TLS extender serves it on its plain health port too)."""
        return f"{self.url}/metrics"

    def serving_args(self) -> tuple[str, ...]:
        """Flags that choose how the extender serves (none: plain HTTP on ``port``)."""
        return ()

    def start(self, follower: bool = False) -> None:
        """Start and wait for ``/readyz`` (the watch cache has synced, and the replica leads);
        ``follower``: a 503 "not the leader" (synced, another replica leads) is enough."""
        cmd = [*GPUPOOL_CLI, "extender", "--host", "127.0.0.1", "--port", str(self.port),
               "--kubeconfig", str(self.kubeconfig), "--policy", self.policy,
               "--lease-namespace", "default", "--identity", "e2e-extender",
               "--unconfirmed-timeout", "600", *self.serving_args(), *self.extra_args]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_cli_env())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log_tail(self.log_path)
            try:
                with urllib.request.urlopen(self.ready_url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                if follower and exc.code == 503 and b"not the leader" in exc.read():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"extender not ready:\n{log_tail(self.log_path)}")

    def kill(self) -> None:
        """SIGKILL (no clean shutdown: the point of the restart tests)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def metric(self, name: str, **labels: str) -> float:
        """One sample of ``/metrics`` (0 when absent)."""
        with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
            text = resp.read().decode()
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith(f"{name}{{{wanted}}} ") or (not labels and line.startswith(f"{name} ")):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def passes(self, pod: Mapping[str, Any], nodes: list[str], ready_timeout: float = 30.0) -> list[str]:
        """The nodes the extender's ``/filter`` passes for ``pod``, from its ledger as it is now.

        A replica that would not bind yet (a follower, or a leader whose ledger is still catching
        up) answers every filter with a retryable ``Error`` and no node; that is no answer about the
        pod, so it is asked again until it answers (``ready_timeout``), never read as "no node fits"
        (a wait for a refusal would otherwise end before the ledger holds what the test booked)."""
        body = json.dumps({"Pod": pod, "NodeNames": nodes}).encode()
        deadline = time.monotonic() + ready_timeout
        while True:
            request = urllib.request.Request(f"{self.url}/filter", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=5) as resp:
                answer = json.loads(resp.read())
            if not answer.get("Error") or time.monotonic() > deadline:
                passed: list[str] = answer.get("NodeNames") or []
                return passed
            time.sleep(0.1)


def isolation_default(args: tuple[str, ...]) -> tuple[str, ...]:
    """``--isolation none`` unless the test chose a backend or a library: fake cards have nothing to
    enforce on, and an agent with ``auto`` and no interception library takes whole cards only."""
    chosen = any(a.split("=")[0] in ("--isolation", "--shim-library") for a in args)
    return () if chosen else ("--isolation", "none")


class NodeAgentProcess:
    """``gpupool node-agent --fake-gpus`` for one test-environment kubelet.

    Pointed at the kubelet's host-side paths (``Kubelet.device_plugin_dir``,
    ``Kubelet.pod_resources_socket``), the way a DaemonSet would mount them, with the control
    plane's kubeconfig for the pod and node annotations.
    """

    def __init__(self, kubelet: Kubelet, kubeconfig: Path, gpus_yaml: str, workdir: Path,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.kubelet = kubelet
        self.extra_args = extra_args
        self.kubeconfig = kubeconfig
        self.gpus = workdir / "gpus.yaml"
        self.gpus.write_text(gpus_yaml)
        self.log_path = workdir / "node-agent.log"
        self.metrics_port = free_port()  # not the default: several agents share the loopback here
        self.usage_state = workdir / "usage-state.json"  # not the node's real /var/lib/gpupool
        self.proc: subprocess.Popen[bytes] | None = None
        self.cli = list(GPUPOOL_CLI)
        """The command before ``node-agent`` (a test may start one life under a wrapper)."""

    def start(self) -> None:
        cmd = [*self.cli, "node-agent", "--node-name", self.kubelet.node_name,
               "--fake-gpus", str(self.gpus), "--plugin-dir", str(self.kubelet.device_plugin_dir),
               "--pod-resources-socket", str(self.kubelet.pod_resources_socket),
               "--kubeconfig", str(self.kubeconfig), "--metrics-port", str(self.metrics_port),
               "--usage-state-file", str(self.usage_state), *self.extra_args,
               *isolation_default(self.extra_args)]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_cli_env())

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def metrics(self) -> str:
        """The agent's ``/metrics`` text."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            text: str = resp.read().decode()
        return text

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 10 s; returns the exit status (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log(self) -> str:
        return log_tail(self.log_path)


# ------------------------------------------------------------------------------ gpupool pods
#: The env keys a gpupool grant sets (the contract in gpupool/api/environment.py).
GRANT_KEYS = ("GPUPOOL_ENV_VERSION", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
              "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
              "GPUPOOL_MEMORY_LIMIT_MIB", "GPUPOOL_COMPUTE_PERCENT", "GPUPOOL_CARD_INDICES",
              "GPUPOOL_CARD_UUIDS", "GPUPOOL_POD", "GPUPOOL_CONTAINER")

ContainerLimits = tuple[str, Mapping[str, str]]
"""A container of :func:`gpu_pod_manifest`: its name and its gpupool limits (empty: no GPU)."""


def gpu_pod_manifest(name: str, containers: list[ContainerLimits], *, node: str | None = None,
                     init: list[ContainerLimits] | None = None,
                     scheduler_name: str | None = None) -> dict[str, Any]:
    """A pod whose containers ask for gpupool resources; pinned to ``node`` by its hostname label.

    Init containers run ``true``, which the test environment's fake runtime lets exit 0 at once, so
    the app containers start after them as on a real node."""
    def spec(c: ContainerLimits, command: tuple[str, ...] = ("sleep", "3600")) -> dict[str, Any]:
        out: dict[str, Any] = {"name": c[0], "image": "busybox:1.36", "command": list(command)}
        if c[1]:
            out["resources"] = {"limits": dict(c[1])}
        return out

    pod_spec: dict[str, Any] = {"containers": [spec(c) for c in containers], "terminationGracePeriodSeconds": 1}
    if init:
        pod_spec["initContainers"] = [spec(c, ("true",)) for c in init]
    if node:
        pod_spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if scheduler_name:
        pod_spec["schedulerName"] = scheduler_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec}


def expected_grant(namespace: str, pod: str, container: str, cards: Any) -> dict[str, str]:
    """The env the node agent must hand a container whose assignment-v1 entry lists ``cards``
    (``CardRef``s, in exposure order): exactly those cards and limits, named for that container.
    A memory-only slice has no compute share (0 %) and does not cap MPS."""
    percents = [max(1, c.compute // 10) if c.compute else 0 for c in cards]
    capped = [p for p in percents if p]
    return {
        "GPUPOOL_ENV_VERSION": "1",
        "NVIDIA_VISIBLE_DEVICES": ",".join(c.uuid for c in cards),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": ",".join(f"{i}={c.memory_mib}M" for i, c in enumerate(cards)),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(min(capped) if capped else 100),
        "GPUPOOL_MEMORY_LIMIT_MIB": ",".join(str(c.memory_mib) for c in cards),
        "GPUPOOL_COMPUTE_PERCENT": ",".join(str(p) for p in percents),
        "GPUPOOL_CARD_INDICES": ",".join(str(c.index) for c in cards),
        "GPUPOOL_CARD_UUIDS": ",".join(c.uuid for c in cards),
        "GPUPOOL_POD": f"{namespace}/{pod}",
        "GPUPOOL_CONTAINER": container,
    }


def env_from_log(log: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of a fake-runtime container log (it prints the container's env)."""
    env: dict[str, str] = {}
    for line in log.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and " " not in key:
            env[key] = value
    return env


def ignore_404(call: Callable[[], object]) -> None:
    """Run ``call``; an object already gone (404) is not an error (clean-ups)."""
    try:
        call()
    except ApiException as exc:
        if exc.status != 404:
            raise


def forbidden_message(call: Callable[[], object]) -> str:
    """The apiserver's message when ``call`` is refused with 403 (an admission policy); "" when it
    succeeded. Any other failure fails the test."""
    try:
        call()
    except ApiException as exc:
        assert exc.status == 403, exc
        return str(json.loads(exc.body)["message"])
    return ""


CRD_DELETION_S = 180.0
"""How long a deleted CRD may take to go: the apiserver first deletes every instance of it, which a
busy control plane (two e2e sessions and the unit tests on two cores) has been seen to take past a
minute."""


def wait_crds_gone(extensions: client.ApiextensionsV1Api, names: set[str], timeout: float = CRD_DELETION_S) -> None:
    """Return once none of the CRDs ``names`` exists (a deleted one lingers, "being deleted", until the
    apiserver has removed its instances); a time-out says what each still reports."""
    def left() -> dict[str, Any]:
        return {c.metadata.name: c for c in extensions.list_custom_resource_definition().items
                if c.metadata.name in names}

    def explain() -> str:
        return "\n".join(f"{name}: deletionTimestamp {crd.metadata.deletion_timestamp}, conditions "
                         + "; ".join(f"{c.type}={c.status} {c.reason}: {c.message}"
                                     for c in (crd.status.conditions or []))
                         for name, crd in sorted(left().items()))

    wait_for(lambda: True if not left() else None, timeout=timeout, what=f"the CRDs {sorted(names)} deleted",
             explain=explain)



@contextmanager
def make_priority_classes(kube_api_client: client.ApiClient, prefix: str, low: int,
                          high: int) -> Iterator[tuple[str, str]]:
    """Two PriorityClasses ``<prefix>-low-<tag>`` and ``<prefix>-high-<tag>`` of values ``low`` and
    ``high`` for a preemption test, deleted after it (one already gone is fine)."""
    api = client.SchedulingV1Api(kube_api_client)
    tag = uuid.uuid4().hex[:6]
    names = (f"{prefix}-low-{tag}", f"{prefix}-high-{tag}")
    for name, value in zip(names, (low, high), strict=True):
        api.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                   "metadata": {"name": name}, "value": value})
    try:
        yield names
    finally:
        for name in names:
            try:
                api.delete_priority_class(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
