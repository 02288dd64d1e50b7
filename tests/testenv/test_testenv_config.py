"""Unit tests of the pure configuration renderers (no control plane needed)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from gpupool.testenv.config import (
    ExtenderConfig,
    render_kubeconfig,
    render_kubelet_config,
    render_scheduler_config,
    render_token_file,
)
from gpupool.testenv.controllers import controller_manager_args
from gpupool.testenv.controlplane import scheduler_args


def test_token_file_single_group_is_plain_csv() -> None:
    assert render_token_file("t0k") == "t0k,admin,admin-uid,system:masters\n"


def test_token_file_quotes_several_groups() -> None:
    line = render_token_file("t", user="u", uid="1", groups=("a", "b"))
    assert line == 't,u,1,"a,b"\n'


def test_kubeconfig_embeds_ca_and_token() -> None:
    config = yaml.safe_load(render_kubeconfig("https://127.0.0.1:1234", "secret", b"PEM"))
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:1234"
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"PEM"
    assert config["users"][0]["user"]["token"] == "secret"
    assert config["current-context"] == config["contexts"][0]["name"]


def test_scheduler_config_without_extender() -> None:
    config = yaml.safe_load(render_scheduler_config("/k/config"))
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["clientConnection"]["kubeconfig"] == "/k/config"
    assert config["leaderElection"]["leaderElect"] is False
    # v1 has no insecure health or metrics address: both are on the secure port of the command line
    assert "healthzBindAddress" not in config and "metricsBindAddress" not in config
    assert "extenders" not in config


def test_scheduler_serves_health_and_metrics_on_a_loopback_secure_port() -> None:
    args = scheduler_args(config=Path("/c.yaml"), kubeconfig=Path("/k"), port=1234)
    assert {"--config=/c.yaml", "--bind-address=127.0.0.1", "--secure-port=1234",
            "--authentication-kubeconfig=/k", "--authorization-kubeconfig=/k"} <= set(args)


def test_scheduler_config_extender_managed_resources_are_ignored_by_scheduler() -> None:
    extender = ExtenderConfig(url_prefix="http://127.0.0.1:9000/gpupool", bind_verb="bind",
                              node_cache_capable=True,
                              managed_resources=("gpupool.io/gpu-mem", "gpupool.io/gpu-core"))
    config = yaml.safe_load(render_scheduler_config("/k", [extender]))
    (entry,) = config["extenders"]
    assert entry["urlPrefix"] == "http://127.0.0.1:9000/gpupool"
    assert entry["filterVerb"] == "filter"
    assert entry["prioritizeVerb"] == "prioritize"
    assert entry["bindVerb"] == "bind"
    assert "preemptVerb" not in entry
    assert entry["weight"] == 1
    assert entry["enableHTTPS"] is False
    assert entry["nodeCacheCapable"] is True
    assert entry["httpTimeout"] == "5s"
    assert entry["managedResources"] == [
        {"name": "gpupool.io/gpu-mem", "ignoredByScheduler": True},
        {"name": "gpupool.io/gpu-core", "ignoredByScheduler": True},
    ]


def test_extender_without_prioritize_has_no_weight() -> None:
    entry = ExtenderConfig(url_prefix="https://x", prioritize_verb=None).to_v1()
    assert "prioritizeVerb" not in entry
    assert "weight" not in entry
    assert entry["enableHTTPS"] is True


def test_kubelet_config_has_the_settings_a_container_less_machine_needs() -> None:
    config = yaml.safe_load(render_kubelet_config(address="192.0.2.2", port=11250, healthz_port=11248,
                                                  runtime_endpoint="unix:///run/cri.sock"))
    assert config["kind"] == "KubeletConfiguration"
    assert config["address"] == "192.0.2.2"
    assert config["port"] == 11250
    assert config["healthzPort"] == 11248
    assert config["readOnlyPort"] == 0
    assert config["cgroupsPerQOS"] is False
    assert config["enforceNodeAllocatable"] == []
    assert config["failSwapOn"] is False
    assert config["makeIPTablesUtilChains"] is False
    assert config["authorization"]["mode"] == "AlwaysAllow"
    assert config["authentication"]["webhook"]["enabled"] is False
    assert config["nodeStatusUpdateFrequency"] == "2s"  # node Ready in ~8 s instead of ~17 s
    assert config["containerRuntimeEndpoint"] == config["imageServiceEndpoint"] == "unix:///run/cri.sock"
    assert config["failCgroupV1"] is False  # kubelet 1.35+ refuses cgroup v1 hosts otherwise


def test_kubelet_config_extra_overrides() -> None:
    config = yaml.safe_load(render_kubelet_config(address="a", port=1, healthz_port=2, runtime_endpoint="unix:///x",
                                                  extra={"featureGates": {"X": True}, "port": 3}))
    assert config["featureGates"] == {"X": True}
    assert config["port"] == 3


def test_controller_manager_runs_only_the_named_controllers_without_leader_election() -> None:
    args = controller_manager_args(kubeconfig=Path("/k"), healthz_port=1234, controllers=("deployment", "replicaset"))
    assert "--controllers=deployment,replicaset" in args
    assert {"--leader-elect=false", "--secure-port=1234", "--bind-address=127.0.0.1",
            "--kubeconfig=/k"} <= set(args)


def test_controller_manager_needs_a_controller() -> None:
    with pytest.raises(ValueError, match="at least one controller"):
        controller_manager_args(kubeconfig=Path("/k"), healthz_port=1, controllers=())
