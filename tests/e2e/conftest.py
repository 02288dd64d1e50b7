"""Fixtures for end-to-end tests against a real kube-apiserver/scheduler/kubelet (the pinned release
that ``$GPUPOOL_TESTENV_K8S_VERSION`` names, the newest by default; ``gpupool/testenv/versions.py``).

Public fixtures (use them from any test under tests/e2e):

* ``testenv_binaries`` (session): the built binaries; builds on first use (minutes, cached after).
* ``control_plane`` (session): a running :class:`gpupool.testenv.ControlPlane`.
* ``kube_api_client`` (session): ``kubernetes.client.ApiClient`` for it; ``core_v1``: ``CoreV1Api``.
* ``namespace``: a fresh namespace, deleted with everything in it after the test.
* ``make_node``: ``make_node(name=None, allocatable={...}, labels={...}) -> str`` registers a Node
  object with no kubelet behind it (deleted after the test).
* ``start_kubelet``: ``start_kubelet(node_name, labels=None, extra_config=None) -> Kubelet`` starts
  a real kubelet with the fake container runtime and waits for the node to be Ready; stopped and
  its Node deleted after the test.
* ``gpupool_extender`` (module): ``gpupool extender`` (policy binpack) as a process, and
  kube-scheduler restarted to call it for gpupool's resources; both undone after the module.
* ``start_node_agent``: ``start_node_agent(kubelet, gpus_yaml, extra_args=()) -> NodeAgentProcess``
  runs ``gpupool node-agent --fake-gpus`` (plus ``extra_args``) against that kubelet; stopped
  after the test.

The environment is skipped (with the reason in the test report) only when it cannot be built on
this machine at all: not root, no apt, or no route to Debian's registry.

How scripts/test-all runs these tests (write new ones to fit): two pytest sessions for ``-m e2e`` on
the newest release share the suite one module at a time (``tests/module_queue.py``: each module runs
whole in one of them, in collection order, but a module cannot count on another having run before it
in its session), beside one session for ``-m "e2e and compat"`` on the oldest and the unit tests, all
on the same two cores (real kubelets take turns: ``tests/e2e/real_containers.py``). Each session has
its own control plane, shared by every test of that session: leave it as you found it (the fixtures
above undo what they start; a test that changes the scheduler or the apiserver puts them back).
Wait for a state with ``wait_for`` and a generous deadline rather than a ``sleep`` sized for a quiet
machine, and give everything on the host a name of its own (``uuid`` suffixes, the control plane's
state directory) so that two sessions on one machine never meet. A test that needs a fresh cluster
starts its own with ``start_control_plane`` instead of restarting the shared one.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from gpupool.api.names import ResourceNames
from gpupool.testenv.build import build_impossible_reason, ensure_binaries
from gpupool.testenv.config import ExtenderConfig
from gpupool.testenv.controlplane import ControlPlane, start_control_plane
from gpupool.testenv.errors import BuildImpossibleError
from gpupool.testenv.kubelet import Kubelet
from gpupool.testenv.kubelet import start_kubelet as _start_kubelet
from gpupool.testenv.paths import Binaries
from tests.e2e.e2e_support import ExtenderProcess, MakeNode, NodeAgentProcess, StartKubelet

#: Resources of a node created with ``make_node`` unless the test says otherwise.
DEFAULT_ALLOCATABLE = {"cpu": "8", "memory": "32Gi", "pods": "110"}


_skip_reason: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say loudly, without ``-rs``, that the end-to-end tests did not run and why."""
    if _skip_reason:
        terminalreporter.write_sep("=", "gpupool testenv unavailable: end-to-end tests skipped", yellow=True)
        terminalreporter.write_line(_skip_reason[0])


def _skip(reason: str) -> NoReturn:
    message = f"gpupool testenv cannot be built on this machine: {reason}"
    _skip_reason.append(message)
    pytest.skip(message)


def _progress(message: str) -> None:
    print(f"[gpupool testenv] {message}", flush=True)


@pytest.fixture(scope="session")
def testenv_binaries() -> Binaries:
    """The test environment's binaries; built on demand, skipped only where building is impossible."""
    reason = build_impossible_reason()
    if reason is not None:
        _skip(reason)
    try:
        return ensure_binaries(log=_progress)
    except BuildImpossibleError as exc:
        _skip(str(exc))


@pytest.fixture(scope="session")
def control_plane(testenv_binaries: Binaries) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-scheduler for the whole session, stopped at the end."""
    plane = start_control_plane(testenv_binaries)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube_api_client(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """The official Kubernetes client, configured from the control plane's kubeconfig."""
    api_client = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        yield api_client
    finally:
        api_client.close()


@pytest.fixture
def core_v1(kube_api_client: client.ApiClient) -> client.CoreV1Api:
    """``CoreV1Api`` bound to the test control plane."""
    return client.CoreV1Api(kube_api_client)


@pytest.fixture
def namespace(core_v1: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace, deleted (pods first, with grace period 0) after the test.

    No namespace controller runs, so the namespace's ``kubernetes`` finalizer is cleared through
    the ``finalize`` subresource; otherwise it would stay Terminating forever.
    """
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        delete_namespace(core_v1, name)


def delete_namespace(core_v1: client.CoreV1Api, name: str) -> None:
    """Force-delete every pod in ``name``, then the namespace itself, without a controller."""
    for pod in core_v1.list_namespaced_pod(name).items:
        try:
            core_v1.delete_namespaced_pod(pod.metadata.name, name, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
    for cm in core_v1.list_namespaced_config_map(name).items:
        core_v1.delete_namespaced_config_map(cm.metadata.name, name)
    core_v1.delete_namespace(name)
    try:
        ns = core_v1.read_namespace(name)
    except ApiException as exc:
        if exc.status == 404:
            return
        raise
    ns.spec.finalizers = []
    core_v1.replace_namespace_finalize(name, ns)


@pytest.fixture
def make_node(core_v1: client.CoreV1Api) -> Iterator[MakeNode]:
    """Create Node objects without a kubelet (the scheduler treats them as schedulable)."""
    created: list[str] = []

    def make(name: str | None = None, allocatable: Mapping[str, str] | None = None,
             labels: Mapping[str, str] | None = None, annotations: Mapping[str, str] | None = None) -> str:
        node_name = name or f"e2e-node-{uuid.uuid4().hex[:8]}"
        resources = {**DEFAULT_ALLOCATABLE, **(allocatable or {})}
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node_name,
                         "labels": {"kubernetes.io/hostname": node_name, **(labels or {})},
                         "annotations": dict(annotations or {})},
            "status": {"capacity": resources, "allocatable": resources},
        }
        core_v1.create_node(body)
        created.append(node_name)
        return node_name

    yield make
    for node_name in created:
        try:
            core_v1.delete_node(node_name)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture
def start_kubelet(control_plane: ControlPlane, core_v1: client.CoreV1Api) -> Iterator[StartKubelet]:
    """Start real kubelets (fake container runtime) by node name; all stopped after the test."""
    started: list[Kubelet] = []

    def start(node_name: str, labels: Mapping[str, str] | None = None,
              extra_config: Mapping[str, Any] | None = None) -> Kubelet:
        kubelet = _start_kubelet(control_plane, node_name, labels=labels, extra_config=extra_config)
        started.append(kubelet)
        return kubelet

    yield start
    for kubelet in reversed(started):
        kubelet.stop(delete_node=True)


@pytest.fixture
def extender_process(control_plane: ControlPlane, tmp_path: Path) -> Iterator[ExtenderProcess]:
    """A ``gpupool extender`` process on the control plane (no scheduler calls it until a test
    starts one that does); killed after the test."""
    process = ExtenderProcess(control_plane.kubeconfig, tmp_path / "extender.log")
    process.start()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture(scope="module")
def gpupool_extender(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ExtenderProcess]:
    """The extender process, and kube-scheduler restarted to call it for gpupool resources only."""
    extender = ExtenderProcess(control_plane.kubeconfig, tmp_path_factory.mktemp("extender") / "extender.log")
    extender.start()
    control_plane.restart_scheduler([
        ExtenderConfig(url_prefix=extender.url, filter_verb="filter", prioritize_verb="prioritize",
                       bind_verb="bind", weight=5, node_cache_capable=True,
                       managed_resources=ResourceNames().managed(), http_timeout_s=10.0)])
    try:
        yield extender
    finally:
        extender.kill()
        control_plane.restart_scheduler([])


@pytest.fixture
def start_node_agent(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Callable[..., NodeAgentProcess]]:
    """Start ``gpupool node-agent --fake-gpus`` processes for kubelets; all stopped after the test."""
    started: list[NodeAgentProcess] = []

    def start(kubelet: Kubelet, gpus_yaml: str, extra_args: tuple[str, ...] = ()) -> NodeAgentProcess:
        workdir = tmp_path / f"agent-{kubelet.node_name}"
        workdir.mkdir()
        agent = NodeAgentProcess(kubelet, control_plane.kubeconfig, gpus_yaml, workdir, extra_args)
        started.append(agent)
        agent.start()
        return agent

    yield start
    for agent in reversed(started):
        agent.stop()
