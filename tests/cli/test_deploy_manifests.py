"""deploy/ must say only what the code understands.

What is checked is what an admin applies: the production overlay as ``kubectl kustomize`` renders it
(deploy/kustomize/overlays/production: the base, the certificate Job, the NetworkPolicy, the agent
Lease requirement), plus the scheduler configurations in deploy/.

A manifest is not executed by any other test: a renamed flag, a probe path the server does not
serve, a Lease name the Role does not cover or a port that differs between the Service and the
scheduler config would only show up on a real cluster, as a crash loop or a scheduler that cannot
reach its extender. These tests parse every container's args with the real click command (the
same parser the container's ``gpupool`` entrypoint runs) and cross-check the values that several
files must agree on.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml

from gpupool.api.cluster_settings import (
    CONFIG_MAP_NAME,
    CONFIG_MAP_NAMESPACE,
    ClusterSettings,
    Setting,
    from_config_data,
)
from gpupool.api.names import ResourceNames
from gpupool.cli.main import SUBCOMMANDS, cli
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.deadlines import deadline_problems, go_duration_s
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.leader_label import LEADER_LABEL
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService
from gpupool.nodeagent.deviceplugin.api import DEVICE_PLUGIN_DIR, POD_RESOURCES_SOCKET
from gpupool.testing.fake_api import FakePodApi
from tests.deploy.kustomize_render import KUBECTL, KUSTOMIZE, NO_KUBECTL, pod_spec, render

if KUBECTL is None:
    pytest.skip(NO_KUBECTL, allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: What an admin applies by default (docs/deploy.md).
OVERLAY = "overlays/production"
#: The image the Dockerfile builds (README "Deploy"); every gpupool container must name it.
IMAGE = "gpupool:latest"


@dataclass(frozen=True)
class Container:
    """One gpupool container of a workload in deploy/, with where it came from (for messages)."""

    file: str
    workload: dict[str, Any]
    spec: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.file}: {self.workload['kind']} {self.workload['metadata']['name']}/{self.spec['name']}"

    @property
    def pod_spec(self) -> dict[str, Any]:
        spec = pod_spec(self.workload)
        assert spec is not None
        return spec

    @property
    def env(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.spec.get("env", [])}


def documents() -> list[tuple[str, dict[str, Any]]]:
    """The rendered production overlay, the scheduler configurations its ConfigMaps hold (gpupool's
    own scheduler's), then every YAML document of deploy/*.yaml (the configurations for a rewired
    default scheduler), each with where it came from."""
    docs = [(OVERLAY, doc) for doc in render(OVERLAY)]
    for _, config_map in list(docs):
        if config_map["kind"] == "ConfigMap":
            for key, text in (config_map.get("data") or {}).items():
                embedded = yaml.safe_load(text) if key.endswith(".yaml") else None
                if isinstance(embedded, dict) and embedded.get("kind") == "KubeSchedulerConfiguration":
                    docs.append((f"{OVERLAY}: ConfigMap {config_map['metadata']['name']}/{key}", embedded))
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def gpupool_containers() -> list[Container]:
    found = []
    for file, doc in documents():
        pod = pod_spec(doc)
        if pod is None:
            continue
        for spec in [*pod.get("initContainers", []), *pod["containers"]]:
            if spec["image"].split(":")[0].endswith("gpupool"):
                found.append(Container(file, doc, spec))
    return found


def by_kind(kind: str) -> Iterator[dict[str, Any]]:
    return (doc for _, doc in documents() if doc["kind"] == kind)


def one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = (d for d in by_kind(kind) if d["metadata"]["name"] == name)
    return doc


def command_of(args: list[str]) -> tuple[click.Command, list[str]]:
    """The click command the container's args name (through a group such as ``certs bootstrap``),
    loaded as ``gpupool`` loads it, and the args left for it."""
    assert args and args[0] in SUBCOMMANDS, f"first arg {args[:1]} is not a gpupool sub-command"
    command = cli.get_command(click.Context(cli), args[0])
    rest = args[1:]
    while isinstance(command, click.Group):
        assert rest and not rest[0].startswith("-"), f"{args}: the group {command.name} needs a sub-command"
        command, rest = command.get_command(click.Context(command), rest[0]), rest[1:]
    assert command is not None, f"{args}: no such command"
    return command, rest


def expand(args: list[str], env: dict[str, dict[str, Any]]) -> list[str]:
    """Substitute ``$(VAR)`` as kubelet does; a variable the container does not define is an error
    (kubelet would pass the text ``$(VAR)`` on unchanged)."""
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in env, f"$({name}) used in args but not defined in the container's env"
        return f"<{name}>"
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value, arg) for arg in args]


def parse(container: Container) -> tuple[click.Command, dict[str, Any]]:
    """Check every option name exists on the command, then let click parse and convert the args
    exactly as the entrypoint would; returns the parameters the command would run with."""
    args = expand(list(container.spec["args"]), container.env)
    command, rest = command_of(args)
    declared = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    for arg in rest:
        if arg.startswith("-"):
            option = arg.split("=", 1)[0]
            assert option in declared, f"{container.where}: {option} is not an option of gpupool {args[0]}"
    ctx = command.make_context(args[0], rest, resilient_parsing=False)
    return command, dict(ctx.params)


def shipped_settings() -> ClusterSettings:
    """What the shipped ConfigMap gpupool-cluster says."""
    (config_map,) = (d for d in by_kind("ConfigMap") if d["metadata"]["name"] == CONFIG_MAP_NAME)
    assert config_map["metadata"]["namespace"] == CONFIG_MAP_NAMESPACE
    return from_config_data(config_map["data"])


def settings_run_with(params: dict[str, Any]) -> ClusterSettings:
    """The shared settings a container runs with: the shipped ConfigMap, its flags on top."""
    assert params["cluster_config"] == f"{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}"
    return shipped_settings().overridden({s: params.get(s.attribute) for s in Setting})


def containers_running(subcommand: str) -> list[Container]:
    found = [c for c in gpupool_containers() if c.spec["args"][0] == subcommand]
    assert found, f"no manifest in deploy/ runs gpupool {subcommand}"
    return found


# ---------------------------------------------------------------------------------------- args


def test_deploy_has_both_components_and_the_certificate_jobs() -> None:
    assert {c.spec["args"][0] for c in gpupool_containers()} == {"extender", "node-agent", "certs"}


@pytest.mark.parametrize("container", gpupool_containers(), ids=lambda c: c.where)
def test_every_arg_parses_with_the_real_command(container: Container) -> None:
    assert "command" not in container.spec, "the image's entrypoint is `gpupool`; give args only"
    assert container.spec["image"] == IMAGE
    parse(container)


@pytest.mark.parametrize("bad", [
    pytest.param(["extender", "--lease-namespce=kube-system"], id="misspelt-extender-flag"),
    pytest.param(["extender", "--policy=nope"], id="unknown-policy"),
    pytest.param(["node-agent", "--plugin_dir=/x"], id="underscore-flag"),
    pytest.param(["node-agent", "--node-name=$(NODE)"], id="unexpanded-variable"),
    pytest.param(["simulat"], id="misspelt-command"),
    pytest.param(["certs", "--namespace=x"], id="group-without-sub-command"),
    pytest.param(["certs", "bootstrap", "--secrets=x"], id="misspelt-sub-command-flag"),
])
def test_the_check_refuses_what_gpupool_would_refuse(bad: list[str]) -> None:
    """The checker itself: a misspelt flag, a bad choice, an undefined variable, a wrong command."""
    container = Container("x.yaml", {"kind": "Pod", "metadata": {"name": "p"}, "spec": {}},
                          {"name": "c", "image": IMAGE, "args": bad})
    with pytest.raises((AssertionError, click.UsageError)):
        parse(container)


def test_dockerfile_entrypoint_is_the_console_script() -> None:
    """The manifests pass args only, so the image's entrypoint must be the ``gpupool`` script."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["gpupool"]' in dockerfile
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'gpupool = "gpupool.cli.main:main"' in pyproject


# ------------------------------------------------------------------------------- node agent


def test_node_agent_learns_its_node_from_the_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod's hostname is the pod name, not the node's: NODE_NAME must come from spec.nodeName
    and reach ``--node-name`` (explicitly as $(NODE_NAME) or through the option's default)."""
    for container in containers_running("node-agent"):
        source = container.env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert source == "spec.nodeName"
        monkeypatch.setenv("NODE_NAME", "gpu-node-7")
        args = [a.replace("$(NODE_NAME)", os.environ["NODE_NAME"]) for a in container.spec["args"]]
        command, rest = command_of(args)
        params = command.make_context(args[0], rest).params
        assert params["node_name"] == "gpu-node-7"


def test_node_agent_mounts_kubelets_socket_directories() -> None:
    """The flags point into volumes that are kubelet's own directories on the host."""
    for container in containers_running("node-agent"):
        _, params = parse(container)
        mounts = {m["mountPath"]: m for m in container.spec["volumeMounts"]}
        host = {v["name"]: v["hostPath"]["path"] for v in container.pod_spec["volumes"] if "hostPath" in v}
        plugins = mounts[params["plugin_dir"]]
        assert host[plugins["name"]] == DEVICE_PLUGIN_DIR and not plugins.get("readOnly", False)
        podres_dir = os.path.dirname(params["pod_resources_socket"])
        assert host[mounts[podres_dir]["name"]] == os.path.dirname(POD_RESOURCES_SOCKET)


def test_node_agent_is_not_privileged_and_runs_only_on_labelled_gpu_nodes() -> None:
    for container in containers_running("node-agent"):
        security = container.spec["securityContext"]
        assert security.get("privileged", False) is False
        assert security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True
        # all dropped; added back only what the usage monitor's sources need (docs/monitor.md)
        assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH"]}
        pod = container.pod_spec
        assert pod["nodeSelector"] == {"gpupool.io/node-agent": "true"}
        assert not pod.get("hostNetwork")
        assert pod.get("hostPID") is True  # the monitor reads the containers' processes in /proc
        assert {t["key"] for t in pod["tolerations"]} >= {"nvidia.com/gpu"}
        assert "resources" in container.spec and not any(
            name in container.spec["resources"].get("limits", {}) for name in ResourceNames().managed())


def host_directory(container: Container, path: str) -> str | None:
    """The host path ``path`` inside the container is on, when a writable hostPath volume holds it
    (the deepest mount containing it, as the kernel resolves it); ``None`` otherwise."""
    host = {v["name"]: v["hostPath"]["path"] for v in container.pod_spec["volumes"] if "hostPath" in v}
    holding = [m for m in container.spec["volumeMounts"]
               if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    if not holding:
        return None
    mount = max(holding, key=lambda m: len(m["mountPath"]))
    if mount["name"] not in host or mount.get("readOnly", False):
        return None
    return host[mount["name"]] + path[len(mount["mountPath"].rstrip("/")):]


def test_node_agent_usage_state_file_is_on_a_host_path() -> None:
    """The monitor's state file outlives the agent's pod: it is on a writable hostPath volume."""
    for container in containers_running("node-agent"):
        _, params = parse(container)
        assert params["usage_monitor"] is True
        directory = os.path.dirname(params["usage_state_file"])
        assert host_directory(container, directory) == directory


def test_node_agent_state_dir_is_the_same_path_on_the_host() -> None:
    """The isolation backends name files under --state-dir in their grants, and the container runtime
    bind-mounts them from the host: the agent must see the host's directory at the same path."""
    for container in containers_running("node-agent"):
        _, params = parse(container)
        assert host_directory(container, params["state_dir"]) == params["state_dir"]
        assert host_directory(container, "/run/gpupool") == "/run/gpupool"


def test_node_agent_metrics_port_is_declared_and_annotated_for_scraping() -> None:
    """--metrics-port is the container's metrics port and the port the prometheus.io annotations name
    (tests/nodeagent/test_metrics.py scrapes the agent's /metrics)."""
    for container in containers_running("node-agent"):
        _, params = parse(container)
        assert params["metrics_port"] > 0
        ports = {p["name"]: p["containerPort"] for p in container.spec["ports"]}
        assert ports["metrics"] == params["metrics_port"]
        notes = container.workload["spec"]["template"]["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true"
        assert int(notes["prometheus.io/port"]) == params["metrics_port"]
        assert notes["prometheus.io/path"] == "/metrics"


# ---------------------------------------------------------------------------------- extender


def _extender_routes(url_prefix: str) -> set[tuple[str, str]]:
    cache = ClusterCache()
    service = ExtenderService(cache, Binder(cache, FakePodApi()), is_leader=lambda: True,
                              leader_name=lambda: "x")
    app = ExtenderApi(service, ResourceNames(), ExtenderMetrics(ledger=cache)).app(url_prefix)
    return {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None}


def _probe_routes() -> set[tuple[str, str]]:
    cache = ClusterCache()
    app = ExtenderApi(ExtenderService(cache, None), ResourceNames(), ExtenderMetrics(ledger=cache)).probe_app()
    return {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None}


def test_extender_ports_probes_and_service_agree() -> None:
    """containerPort = --port, probe paths are served on the plain health port (the verbs' port asks
    for a client certificate kubelet does not have), the Service targets the verbs' port."""
    for container in containers_running("extender"):
        _, params = parse(container)
        assert params["tls_cert_file"] and params["client_ca_file"], "production serves the verbs over mutual TLS"
        ports = {p["name"]: p["containerPort"] for p in container.spec["ports"]}
        for probe in ("readinessProbe", "livenessProbe"):
            get = container.spec[probe]["httpGet"]
            assert ports[get["port"]] == params["health_port"] != params["port"]
            assert get.get("scheme", "HTTP") == "HTTP" and ("GET", get["path"]) in _probe_routes()
        # the leader's pod carries the label its replica keeps while it takes binds (--leader-pod)
        assert params["leader_pod"] == "<POD_NAMESPACE>/<POD_NAME>"  # env expanded as kubelet would
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container.spec["env"]}
        assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
        assert container.spec["readinessProbe"]["httpGet"]["path"] == "/syncz"
        assert container.workload["spec"]["strategy"] == {
            "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        labels = {**container.workload["spec"]["template"]["metadata"]["labels"], LEADER_LABEL: "true"}
        services = {s["metadata"]["name"]: s for s in by_kind("Service")
                    if s["metadata"]["namespace"] == container.workload["metadata"]["namespace"]
                    and s["spec"]["selector"].items() <= labels.items()}
        assert set(services) == {"gpupool-extender", "gpupool-extender-admission"}
        leader, every_replica = services["gpupool-extender"], services["gpupool-extender-admission"]
        assert leader["spec"]["selector"][LEADER_LABEL] == "true"
        assert LEADER_LABEL not in every_replica["spec"]["selector"]
        # the verbs go to the leader (the labelled replica), the webhooks to every replica
        assert [ports[p["targetPort"]] for p in leader["spec"]["ports"]] == [params["port"]]
        assert [ports[p["targetPort"]] for p in every_replica["spec"]["ports"]] == [params["admission_port"]]
        assert every_replica["spec"]["publishNotReadyAddresses"] is True and \
            not leader["spec"].get("publishNotReadyAddresses")
        notes = container.workload["spec"]["template"]["metadata"]["annotations"]
        assert int(notes["prometheus.io/port"]) == params["health_port"] and ("GET", "/metrics") in _probe_routes()


@pytest.mark.slow
def test_scheduler_configs_reach_the_extender_service_and_its_verbs() -> None:
    """urlPrefix host/port is the Service, its path + verb is a route, managedResources is exactly
    what the extender manages."""
    (container,) = containers_running("extender")
    _, params = parse(container)
    routes = _extender_routes(params["url_prefix"])
    service = one("Service", "gpupool-extender")  # the leader's: the webhooks' Service lists every replica
    configs = list(by_kind("KubeSchedulerConfiguration"))
    assert {c["apiVersion"].split("/")[1] for c in configs} == {"v1"}
    for config in configs:
        (entry,) = config["extenders"]
        url = urlsplit(entry["urlPrefix"])
        assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
        assert url.port == service["spec"]["ports"][0]["port"]
        assert url.scheme == ("https" if entry["enableHTTPS"] else "http")
        assert url.path.rstrip("/") == params["url_prefix"].rstrip("/")
        for verb in ("filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb"):
            if verb in entry:
                assert ("POST", f"{url.path.rstrip('/')}/{entry[verb]}") in routes
        managed = [m["name"] for m in entry["managedResources"]]
        assert sorted(managed) == sorted(ResourceNames(settings_run_with(params).resource_domain).managed())
        assert all(m["ignoredByScheduler"] for m in entry["managedResources"])


def test_extender_lease_flags_match_its_role() -> None:
    """The Role covers exactly the Lease the flags name, in the namespace they name."""
    (container,) = containers_running("extender")
    _, params = parse(container)
    assert params["leader_elect"]
    role = one("Role", "gpupool-extender-lease")
    assert role["metadata"]["namespace"] == params["lease_namespace"]
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named and all(r["resourceNames"] == [params["lease_name"]] for r in named)


@pytest.mark.slow
def test_extender_tls_files_come_from_the_mounted_secret() -> None:
    """--tls-cert-file, --tls-private-key-file and --client-ca-file are the keys of one mounted Secret
    in cert-manager's layout (tls.crt, tls.key, ca.crt); the scheduler configs present a client
    certificate and verify the extender with a CA."""
    (container,) = containers_running("extender")
    _, params = parse(container)
    mounts = {m["name"]: m["mountPath"] for m in container.spec["volumeMounts"]}
    volumes = {v["name"]: v for v in container.pod_spec["volumes"]}
    (tls,) = (name for name, v in volumes.items() if "secret" in v)
    for flag, key in (("tls_cert_file", "tls.crt"), ("tls_private_key_file", "tls.key"), ("client_ca_file", "ca.crt")):
        assert params[flag] == f"{mounts[tls]}/{key}"
    for config in by_kind("KubeSchedulerConfiguration"):
        (entry,) = config["extenders"]
        assert entry["enableHTTPS"] is True and set(entry["tlsConfig"]) == {"certFile", "keyFile", "caFile"}


@pytest.mark.slow
def test_agent_and_extender_agree_on_the_lease_namespace_and_its_roles() -> None:
    """The agents renew where the extender watches; each has exactly its Lease verbs there, and
    the namespace is the agents' own (no control-plane Lease within their reach)."""
    (extender,) = containers_running("extender")
    (agent,) = containers_running("node-agent")
    _, extender_params = parse(extender)
    _, agent_params = parse(agent)
    namespace = settings_run_with(agent_params).agent_lease_namespace
    assert settings_run_with(extender_params).agent_lease_namespace == namespace != "kube-system"
    assert settings_run_with(extender_params).require_agent_lease  # the ConfigMap says so (production)
    assert agent_params["lease_renew_interval"] < agent_params["lease_duration"]
    assert any(doc["metadata"]["name"] == namespace for doc in by_kind("Namespace"))
    verbs = {}
    for binding in by_kind("RoleBinding"):
        if binding["metadata"]["namespace"] != namespace:
            continue
        role = one("Role", binding["roleRef"]["name"])
        assert role["metadata"]["namespace"] == namespace
        for subject in binding["subjects"]:
            verbs[subject["name"]] = {v for r in role["rules"] for v in r["verbs"] if "leases" in r["resources"]}
    assert verbs == {"gpupool-extender": {"list", "watch"}, "gpupool-node-agent": {"create", "get", "update"}}


def test_extender_is_read_only_and_non_root() -> None:
    (container,) = containers_running("extender")
    security = container.spec["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"] for m in container.spec.get("volumeMounts", [])}
    assert "/tmp" in mounts  # Python's tempfile and the client's CA/cert temp files have a place


# ------------------------------------------------------------------------------------- RBAC


@pytest.mark.slow
@pytest.mark.parametrize("container", gpupool_containers(), ids=lambda c: c.where)
def test_every_workloads_service_account_exists_and_is_bound(container: Container) -> None:
    namespace = container.workload["metadata"]["namespace"]
    account = container.pod_spec["serviceAccountName"]
    assert any((sa["metadata"]["name"], sa["metadata"]["namespace"]) == (account, namespace)
               for sa in by_kind("ServiceAccount"))
    bound = [b for kind in ("ClusterRoleBinding", "RoleBinding") for b in by_kind(kind)
             if {"kind": "ServiceAccount", "name": account, "namespace": namespace} in b["subjects"]]
    assert bound
    for binding in bound:
        role = one(binding["roleRef"]["kind"], binding["roleRef"]["name"])
        assert role["rules"]


def test_every_rbac_file_lists_its_permissions_in_a_header() -> None:
    """Reviewers read the header, the apiserver reads the rules: each rule's resources are named."""
    files = sorted(KUSTOMIZE.rglob("*rbac*.yaml"))
    assert {p.parent.name for p in files} >= {"base", "certs-bootstrap"}
    for path in files:
        header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
        for doc in yaml.safe_load_all(path.read_text()):
            for rule in (doc or {}).get("rules", []):
                for resource in rule["resources"]:
                    assert resource in header, f"{path.name}: {resource} not explained in the header"


@pytest.mark.slow
def test_the_shipped_cluster_config_is_the_built_in_defaults_and_no_flag_overrides_it() -> None:
    """The ConfigMap names every setting with the value a component without it runs with, and no
    shipped container overrides one (an override would silently beat an admin's edit of the
    ConfigMap) or uses a deprecated spelling."""
    base = yaml.safe_load_all((KUSTOMIZE / "base" / "cluster-config.yaml").read_text())
    (base_map,) = (d for d in base if d["kind"] == "ConfigMap" and d["metadata"]["name"] == CONFIG_MAP_NAME)
    assert set(base_map["data"]) == {s.value for s in Setting}
    assert from_config_data(base_map["data"]) == ClusterSettings()
    # the production overlay turns on one rule, in the ConfigMap (components/require-agent-lease)
    assert shipped_settings() == ClusterSettings(require_agent_lease=True)
    for container in [*containers_running("extender"), *containers_running("node-agent")]:
        _, params = parse(container)
        assert {s: params.get(s.attribute) for s in Setting} == dict.fromkeys(Setting), container.where
        assert not [k for k, v in params.items() if k.startswith("old_") and v is not None], container.where


def test_both_components_may_read_the_cluster_config_and_nothing_else_by_it() -> None:
    """One Role grants get on exactly the ConfigMap gpupool-cluster, bound to both ServiceAccounts."""
    (role,) = (r for r in by_kind("Role") if any("configmaps" in rule["resources"] for rule in r["rules"]))
    assert role["metadata"]["namespace"] == CONFIG_MAP_NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CONFIG_MAP_NAME],
                              "verbs": ["get"]}]
    (binding,) = (b for b in by_kind("RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"])
    assert {s["name"] for s in binding["subjects"]} == {"gpupool-extender", "gpupool-node-agent"}


def test_every_scheduler_config_gives_the_extender_time_for_its_binds_and_assumptions() -> None:
    """httpTimeout is above the shipped extender's --bind-deadline and at most its --assume-deadline."""
    (container,) = containers_running("extender")
    _, params = parse(container)
    for config in by_kind("KubeSchedulerConfiguration"):
        (entry,) = config["extenders"]
        timeout = go_duration_s(entry["httpTimeout"])
        assert deadline_problems(timeout, params["bind_deadline"], params["assume_deadline"]) == []
