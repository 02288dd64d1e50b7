"""The node agent composed from one options object (issue 22): each feature a part the agent is
built with, present exactly when its options ask for it, and wired into the agent's constructor
(not attached afterwards)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.core.model import ContainerAssignment
from gpupool.nodeagent.assembly import AgentParts, build_agent
from gpupool.nodeagent.dra.setup import DraOptions
from gpupool.nodeagent.isolation.setup import IsolationConfig
from gpupool.nodeagent.lending.checkpoint import CheckpointEnforcement
from gpupool.nodeagent.lending.options import LendingOptions
from gpupool.nodeagent.monitor.service import MonitorConfig
from gpupool.nodeagent.options import AgentOptions, AgentOptionsError, RiskOptions
from gpupool.nodeagent.risk.findings import RiskAction
from gpupool.nodeagent.types import PodView

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture
def node(tmp_path: Path) -> AgentOptions:
    """An agent on two fake cards, with every file it writes under ``tmp_path`` and an API server
    that is never reached (nothing here runs the parts)."""
    (tmp_path / "gpus.yaml").write_text("model: Fake-T4\ncards:\n  - {memoryMiB: 15360}\n  - {memoryMiB: 15360}\n")
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    return AgentOptions("node-a", fake_gpus=str(tmp_path / "gpus.yaml"), kubeconfig=str(tmp_path / "kubeconfig"),
                        plugin_dir=str(tmp_path / "plugins"), metrics_port=0,
                        monitor=MonitorConfig(str(tmp_path / "usage" / "state.json")),
                        isolation=IsolationConfig("none", state_dir=str(tmp_path / "state")))


@contextlib.contextmanager
def built(options: AgentOptions) -> Iterator[AgentParts]:
    parts = asyncio.run(build_agent(options))
    try:
        yield parts
    finally:
        parts.close()


@pytest.mark.slow  # imports the kubernetes client
def test_the_plain_agent_has_no_lending_no_dra_and_serves_the_fake_cards(node: AgentOptions) -> None:
    with built(node) as parts:
        assert parts.agent.lent is None and parts.lending is None
        assert parts.agent.claims_granted is None and parts.dra is None
        assert len(parts.agent.inventory.cards) == 2
        assert parts.manager is not None and parts.enforcement is parts.agent.enforcement


@pytest.mark.slow  # imports the kubernetes client
def test_lending_is_a_part_the_agent_is_built_with(node: AgentOptions, tmp_path: Path) -> None:
    """With lending options and a monitor the agent is constructed with the lending part; its lent
    devices and borrower check read the agent's cards once it exists (no loans yet: none)."""
    options = replace(node, lending=LendingOptions(str(tmp_path / "checkpoints")))
    with built(options) as parts:
        assert parts.lending is not None and parts.agent.lent is parts.lending
        assert parts.monitor is not None
        for resource in parts.agent.resources:
            assert parts.lending.extra_devices(resource) == []
            assert parts.agent.device_list(resource) == parts.agent.layout.devices(resource, parts.agent.inventory)
        assert parts.lending.service.loans == {}
        # each grant is told to the lending service (an owner booked on a lent card: docs/lending.md)
        assert isinstance(parts.agent.enforcement, CheckpointEnforcement)
        assert parts.agent.enforcement.granted == parts.lending.service.owner_granted


def test_lending_without_the_monitor_is_refused_naming_the_flag(node: AgentOptions, tmp_path: Path) -> None:
    with pytest.raises(AgentOptionsError, match="lending needs the usage monitor") as caught:
        replace(node, monitor=None, lending=LendingOptions(str(tmp_path / "c")))
    assert caught.value.option == "--lending"


@pytest.mark.slow  # imports the kubernetes client
def test_the_dra_drivers_claims_are_counted_by_the_agent_from_its_construction(node: AgentOptions,
                                                                                tmp_path: Path) -> None:
    options = replace(node, dra=DraOptions(str(tmp_path / "kubelet"), str(tmp_path / "cdi")))
    with built(options) as parts:
        assert parts.dra is not None
        assert parts.agent.claims_granted == parts.dra.state.as_pods
        assert parts.agent.claims_granted() == []


@pytest.mark.slow  # imports the kubernetes client
def test_lending_beside_dra_books_the_drivers_prepared_claims(node: AgentOptions, tmp_path: Path) -> None:
    """With both, the lending side reads the claims the driver prepared (a claim's containers are
    booked on its cards: docs/lending.md, "DRA claims"); without --dra it reads none."""
    lending = LendingOptions(str(tmp_path / "checkpoints"))
    options = replace(node, lending=lending, dra=DraOptions(str(tmp_path / "kubelet"), str(tmp_path / "cdi")))
    with built(options) as parts:
        assert parts.lending is not None and parts.dra is not None
        assert parts.lending.service.pods.prepared == parts.dra.state.as_pods
    with built(replace(node, lending=lending)) as parts:
        assert parts.lending is not None and list(parts.lending.service.pods.prepared()) == []


def test_dra_with_an_acting_risk_action_is_refused(node: AgentOptions) -> None:
    with pytest.raises(AgentOptionsError, match="cannot be combined with --dra") as caught:
        replace(node, dra=DraOptions(), risk=RiskOptions(RiskAction.EVICT))
    assert caught.value.option == "--risk-action"


@pytest.mark.slow  # imports the kubernetes client
def test_without_the_monitor_there_are_no_risk_checks_and_no_gate(node: AgentOptions) -> None:
    with built(replace(node, monitor=None)) as parts:
        assert parts.monitor is None and parts.risk is None and parts.gate is None
    with built(node) as parts:
        assert parts.monitor is not None and parts.risk is not None


@pytest.mark.slow  # imports the kubernetes client
def test_a_fake_gpu_file_it_cannot_read_names_the_flag(node: AgentOptions, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("cards: [{memoryMiB: -1}]\n")
    with pytest.raises(AgentOptionsError) as caught:
        asyncio.run(build_agent(replace(node, fake_gpus=str(tmp_path / "bad.yaml"))))
    assert caught.value.option == "--fake-gpus"


def test_the_served_aliases_and_heartbeat_follow_the_cluster_settings() -> None:
    from gpupool.api.cluster_settings import ClusterSettings
    from gpupool.api.names import NVIDIA_GPU

    plain = AgentOptions("n")
    assert plain.aliases == () and plain.heartbeat is not None
    hami = AgentOptions("n", cluster=ClusterSettings(hami=True, agent_lease_namespace=""),
                        alias_families=("gpushare",))
    assert NVIDIA_GPU in hami.aliases and "aliyun.com/gpu-mem" in hami.aliases and hami.heartbeat is None
    with pytest.raises(AgentOptionsError, match="unknown alias family") as caught:
        AgentOptions("n", alias_families=("nope",))
    assert caught.value.option == "--serve-aliases"


class OneLentDevice:
    """Lent capacity of one device of every resource, vouching for the pod "borrower"."""

    def extra_devices(self, resource: str) -> list[tuple[str, bool]]:
        return [(f"lend-{resource}", True)]

    def vouch(self, pod: PodView, container: ContainerAssignment) -> bool:
        return pod.name == "borrower"

    def on_loan(self, pod: PodView) -> bool:
        return pod.name == "borrower"

    def start_refusal(self, pod: PodView) -> str | None:
        return None


def test_the_agent_lists_the_lent_devices_of_the_part_it_was_built_with() -> None:
    from gpupool.nodeagent.agent import NodeAgent
    from gpupool.nodeagent.allocated_codec import encode_served
    from gpupool.nodeagent.nvml.fake import FakeGpuBackend
    from gpupool.testing.memory_pod_source import InMemoryPodSource
    from tests.nodeagent.harness import NAMES

    backend = FakeGpuBackend.from_dict({"model": "T4", "cards": [{"memoryMiB": 15360}]})
    plain = NodeAgent("node-a", NAMES, backend, InMemoryPodSource(NAMES), None, encode_served)  # type: ignore[arg-type]
    lending = NodeAgent("node-a", NAMES, backend, InMemoryPodSource(NAMES), None, encode_served,  # type: ignore[arg-type]
                        lent=OneLentDevice())
    for resource in plain.resources:
        assert lending.device_list(resource) == [*plain.device_list(resource), (f"lend-{resource}", True)]
