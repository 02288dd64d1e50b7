"""Pure renderers of the configuration files the components read (no I/O, unit-tested).

Each function returns the file's text; callers decide where it goes. YAML is written with
``yaml.safe_dump`` from plain data so quoting is always right.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

#: Service CIDR of the test cluster; no controller-manager allocates from it, but the flag is required.
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"


@dataclass(frozen=True)
class ExtenderConfig:
    """One scheduler extender, as kube-scheduler's ``KubeSchedulerConfiguration`` v1 states it.

    ``managed_resources`` are declared ``ignoredByScheduler: true``: the scheduler leaves their
    accounting to the extender, and sends the extender only pods that request one of them (so
    plain pods keep scheduling while the extender is down).
    """

    url_prefix: str
    filter_verb: str | None = "filter"
    prioritize_verb: str | None = "prioritize"
    bind_verb: str | None = None
    preempt_verb: str | None = None
    weight: int = 1
    node_cache_capable: bool = False
    managed_resources: tuple[str, ...] = ()
    ignorable: bool = False
    http_timeout_s: float = 5.0

    def to_v1(self) -> dict[str, Any]:
        """The ``extenders[]`` entry of a ``KubeSchedulerConfiguration``."""
        entry: dict[str, Any] = {"urlPrefix": self.url_prefix}
        for key, verb in (("filterVerb", self.filter_verb), ("prioritizeVerb", self.prioritize_verb),
                          ("bindVerb", self.bind_verb), ("preemptVerb", self.preempt_verb)):
            if verb:
                entry[key] = verb
        if self.prioritize_verb:
            entry["weight"] = self.weight  # the scheduler rejects weight 0 for a prioritizer
        entry["enableHTTPS"] = self.url_prefix.startswith("https://")
        entry["nodeCacheCapable"] = self.node_cache_capable
        entry["ignorable"] = self.ignorable
        entry["httpTimeout"] = f"{self.http_timeout_s:g}s"
        if self.managed_resources:
            entry["managedResources"] = [
                {"name": name, "ignoredByScheduler": True} for name in self.managed_resources
            ]
        return entry


def render_token_file(token: str, user: str = "admin", uid: str = "admin-uid",
                      groups: Sequence[str] = ("system:masters",)) -> str:
    """The apiserver's ``--token-auth-file``: one CSV line ``token,user,uid,"group1,group2"``."""
    group_field = ",".join(groups)
    if len(groups) > 1:
        group_field = f'"{group_field}"'
    return f"{token},{user},{uid},{group_field}\n"


def render_kubeconfig(server: str, token: str, ca_cert_pem: bytes, name: str = "gpupool-testenv") -> str:
    """A kubeconfig for ``server`` with bearer-token auth; the CA is embedded so the file is portable."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca_cert_pem).decode("ascii"),
        }}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "admin"}}],
        "current-context": name,
    }
    return yaml.safe_dump(config, sort_keys=False)


def render_scheduler_config(kubeconfig: str, extenders: Sequence[ExtenderConfig] = ()) -> str:
    """A ``kubescheduler.config.k8s.io/v1`` configuration.

    Leader election is off (one scheduler per test cluster, and a lease would make a restarted
    scheduler wait for the old lease to expire). Health and metrics are served on the secure port
    the command line names (v1 has no insecure addresses), on loopback, so several clusters on one
    machine never collide on the default port 10259.
    """
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "leaderElection": {"leaderElect": False},
    }
    if extenders:
        config["extenders"] = [e.to_v1() for e in extenders]
    return yaml.safe_dump(config, sort_keys=False)


def render_kubelet_config(*, address: str, port: int, healthz_port: int, runtime_endpoint: str,
                          extra: Mapping[str, Any] | None = None) -> str:
    """A ``kubelet.config.k8s.io/v1beta1`` configuration for a test node.

    Every setting here is one that a real node gets from its OS setup and a test machine lacks:
    no QoS cgroups or node-allocatable enforcement (we may run inside a container), no swap check,
    no iptables chains, no webhook auth (the apiserver talks to the kubelet only for logs), and
    eviction thresholds low enough that a busy build machine does not evict test pods.
    ``failCgroupV1: false``: kubelet 1.35+ refuses to start on cgroup v1 by default, and this
    project's machines mount the v1 hierarchies (the unified one has no controllers). The CRI
    endpoint (``unix://...``) serves both the runtime and the image service.
    """
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": runtime_endpoint,
        "imageServiceEndpoint": runtime_endpoint,
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "clusterDomain": "cluster.local",
        # Ready (and device-plugin resources) reach the Node object within seconds, not 10 s.
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
    }
    if extra:
        config.update(extra)
    return yaml.safe_dump(config, sort_keys=False)
