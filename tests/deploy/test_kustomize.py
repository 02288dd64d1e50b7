"""deploy/kustomize as ``kubectl kustomize`` renders it: overlays, components, Pod Security, NetworkPolicy.

tests/cli/test_deploy_manifests.py parses every container's args in the production overlay with
the real commands; this module checks what differs between the overlays and what the components
add, and tests/e2e/test_deploy_e2e.py sends each overlay to the real apiserver (server-side dry
run).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.shim.build import PACKAGED_LIBRARY
from tests.deploy.kustomize_render import KUSTOMIZE, OVERLAYS, ROOT, pod_spec, render, require_kubectl
from tests.deploy.pod_security import baseline_violations, restricted_violations

NAMESPACES = {"gpupool-system": "restricted", "gpupool-node": "privileged", "gpupool-node-lease": "restricted"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding"}
SHIM_COMPONENT = "components/shim-isolation"


@pytest.fixture(autouse=True)
def _kubectl() -> None:
    require_kubectl()


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = (d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)
    return doc


def container(doc: dict[str, Any]) -> dict[str, Any]:
    spec = pod_spec(doc)
    assert spec is not None
    first: dict[str, Any] = spec["containers"][0]
    return first


def with_components(tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    """The base with these components, as an overlay of an admin's own would have it."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(KUSTOMIZE / "base", tmp_path)],
        "components": [os.path.relpath(KUSTOMIZE / c, tmp_path) for c in components]}))
    return render(str(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_lives_in_gpupools_namespaces(overlay: str) -> None:
    """Nothing lands in kube-system or default: the namespaces carry the Pod Security labels."""
    docs = render(f"overlays/{overlay}")
    for doc in docs:
        where = doc["metadata"].get("namespace")
        if doc["kind"] in CLUSTER_SCOPED:
            assert where is None, doc["metadata"]["name"]
        else:
            assert where in NAMESPACES, (doc["kind"], doc["metadata"]["name"], where)
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpupool"
    levels = {d["metadata"]["name"]: d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
              for d in docs if d["kind"] == "Namespace"}
    assert levels == NAMESPACES


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_meet_their_namespaces_pod_security_level(overlay: str) -> None:
    """Every pod in a `restricted` namespace passes `restricted`; the node agent, alone in the
    `privileged` one, really needs more than `baseline` (else its namespace should be stricter)."""
    workloads = [(d, spec) for d in render(f"overlays/{overlay}") if (spec := pod_spec(d)) is not None]
    assert {d["kind"] for d, _ in workloads} >= {"Deployment", "DaemonSet"}
    for doc, spec in workloads:
        level = NAMESPACES[doc["metadata"]["namespace"]]
        if level == "restricted":
            assert restricted_violations(spec) == [], doc["metadata"]["name"]
        else:
            assert doc["kind"] == "DaemonSet" and doc["metadata"]["name"] == "gpupool-node-agent"
            assert {"host namespace hostPID", "node-agent: adds capability SYS_ADMIN"} <= set(baseline_violations(spec))


def test_the_pod_security_check_itself_refuses_what_the_standard_refuses() -> None:
    ok = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
          "volumes": [{"name": "tmp", "emptyDir": {}}],
          "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False,
                                                           "capabilities": {"drop": ["ALL"]}}}]}
    assert restricted_violations(ok) == []
    bad = yaml.safe_load(yaml.safe_dump(ok))
    bad["securityContext"].pop("seccompProfile")
    bad["volumes"].append({"name": "h", "hostPath": {"path": "/"}})
    bad["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    assert restricted_violations(bad) == [
        "hostPath volume h", "c: adds capability SYS_ADMIN", "volume h of a type restricted forbids",
        "c: seccompProfile None, not RuntimeDefault or Localhost", "c: adds SYS_ADMIN"]


def test_network_policy_lets_only_the_schedulers_reach_the_verbs_and_anyone_the_probes_and_webhooks() -> None:
    docs = render("overlays/production")
    policy = one(docs, "NetworkPolicy", "gpupool-extender")
    extender = one(docs, "Deployment", "gpupool-extender")
    labels = extender["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = {p["name"]: p["containerPort"] for p in container(extender)["ports"]}
    rules = {tuple(p["port"] for p in rule["ports"]): rule.get("from") for rule in policy["spec"]["ingress"]}
    assert set(rules) == {(ports["https"],), (ports["health"],), (ports["admission"],)}
    assert rules[(ports["health"],)] is None  # from anywhere: kubelet's probes, Prometheus
    assert rules[(ports["admission"],)] is None  # the apiserver, from wherever the cluster calls webhooks
    scheduler_pods, control_plane, gpupool_scheduler = rules[(ports["https"],)]
    assert scheduler_pods == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                              "podSelector": {"matchLabels": {"component": "kube-scheduler"}}}
    assert set(control_plane) == {"ipBlock"}  # the admin's control-plane addresses (hostNetwork schedulers)
    # gpupool's own scheduler: its pods, in the extender's namespace (a peer without namespaceSelector)
    own = one(docs, "Deployment", "gpupool-scheduler")
    assert own["metadata"]["namespace"] == policy["metadata"]["namespace"]
    assert gpupool_scheduler == {"podSelector": {"matchLabels": own["spec"]["template"]["metadata"]["labels"]}}


@pytest.mark.slow
@pytest.mark.parametrize("overlay", ["production", "production-cert-manager"])
def test_production_overlays_require_agent_leases_and_a_certificate_source(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    args = container(one(docs, "Deployment", "gpupool-extender"))["args"]
    # in the cluster's ConfigMap, so that kubectl gpupool why applies it too (docs/cluster-config.md)
    assert one(docs, "ConfigMap", "gpupool-cluster")["data"]["requireAgentLease"] == "true"
    assert not [a for a in args if "require-agent-lease" in a]
    secret = next(v["secret"]["secretName"] for v in pod_spec(one(docs, "Deployment", "gpupool-extender"))["volumes"]
                  if "secret" in v)
    issued = [d for d in docs if d["kind"] == "Certificate" and d["spec"]["secretName"] == secret]
    bootstrap = [d for d in docs if d["kind"] in ("Job", "CronJob")]
    if overlay == "production":
        assert not issued and {d["kind"] for d in bootstrap} == {"Job", "CronJob"}
        for job in bootstrap:
            assert f"--secret={secret}" in container(job)["args"]
            assert "--namespace=gpupool-system" in container(job)["args"]
    else:
        assert not bootstrap
        (serving,) = issued
        assert "gpupool-extender.gpupool-system.svc" in serving["spec"]["dnsNames"]
        client = one(docs, "Certificate", "gpupool-extender-client")
        assert client["spec"]["usages"] == ["client auth", "digital signature"]
        assert client["spec"]["issuerRef"] == serving["spec"]["issuerRef"]  # the CA the extender trusts


def test_dev_overlay_runs_on_fake_gpus_without_the_nvidia_runtime() -> None:
    docs = render("overlays/dev")
    agent = one(docs, "DaemonSet", "gpupool-node-agent")
    spec = pod_spec(agent)
    assert spec is not None and "runtimeClassName" not in spec
    args = container(agent)["args"]
    (fake,) = [a.split("=", 1)[1] for a in args if a.startswith("--fake-gpus=")]
    mount = next(m for m in container(agent)["volumeMounts"] if fake.startswith(m["mountPath"] + "/"))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])  # the generated name, hash and all
    assert config_map["metadata"]["namespace"] == agent["metadata"]["namespace"]
    gpus = config_map["data"][Path(fake).name]
    assert len(FakeGpuBackend.from_dict(yaml.safe_load(gpus)).inventory().cards) == 2
    assert one(docs, "Deployment", "gpupool-extender")["spec"]["replicas"] == 1
    assert not [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert "--require-agent-lease" not in container(one(docs, "Deployment", "gpupool-extender"))["args"]
    assert one(docs, "ConfigMap", "gpupool-cluster")["data"]["requireAgentLease"] == "false"


def test_shim_component_names_the_library_the_image_builds(tmp_path: Path) -> None:
    """--isolation=shim with --shim-library at the path the Dockerfile's build puts it (its
    site-packages under /install, copied to /usr/local in the runtime stage)."""
    docs = with_components(tmp_path, SHIM_COMPONENT)
    args = container(one(docs, "DaemonSet", "gpupool-node-agent"))["args"]
    assert "--isolation=shim" in args
    (library,) = [a.split("=", 1)[1] for a in args if a.startswith("--shim-library=")]
    dockerfile = (ROOT / "Dockerfile").read_text()
    built = re.search(r"shim build \\?\s*--output (\S+)", dockerfile)
    assert built is not None, "the Dockerfile's build stage must run `gpupool shim build --output PATH`"
    assert re.search(r"^COPY --from=build /install /usr/local$", dockerfile, re.M), \
        "the runtime stage must copy the build stage's /install prefix to /usr/local"
    assert library == built.group(1).replace("/install/", "/usr/local/", 1)
    # Where `gpupool shim path` looks in the image: the packaged library of the installed package,
    # under the site-packages of the base image's Python.
    (python,) = set(re.findall(r"^FROM python:(\d+\.\d+)-slim", dockerfile, re.M))
    site = f"/usr/local/lib/python{python}/site-packages/"
    assert library.startswith(site)
    assert library[len(site):] == PACKAGED_LIBRARY.relative_to(PACKAGED_LIBRARY.parents[3]).as_posix()


@pytest.mark.slow
def test_dmem_component_mounts_the_host_cgroup_root_where_the_agent_looks(tmp_path: Path) -> None:
    """The host's cgroup v2 root read-write at the path --cgroup-root names, and the command accepts it."""
    from gpupool.cli.node_agent_cmd import node_agent

    docs = with_components(tmp_path, "components/dmem-limits")
    agent = one(docs, "DaemonSet", "gpupool-node-agent")
    args = container(agent)["args"]
    params = node_agent.make_context("node-agent", [a for a in args[1:] if not a.startswith("--node-name")]).params
    (mount,) = [m for m in container(agent)["volumeMounts"] if m["name"] == "host-cgroup"]
    (volume,) = [v for v in pod_spec(agent)["volumes"] if v["name"] == "host-cgroup"]
    assert params["cgroup_root"] == mount["mountPath"] and not mount.get("readOnly", False)
    assert volume["hostPath"] == {"path": "/sys/fs/cgroup", "type": "Directory"}


@pytest.mark.slow
def test_risk_evict_component_switches_the_action_and_grants_only_eviction(tmp_path: Path) -> None:
    """The base only reports; the component's --risk-action comes last (click keeps the last), and
    its ClusterRole adds create on pods/eviction for the agent's ServiceAccount, nothing else."""
    from gpupool.cli.node_agent_cmd import node_agent

    base_args = container(one(render("base"), "DaemonSet", "gpupool-node-agent"))["args"]
    docs = with_components(tmp_path, "components/risk-evict")
    agent = one(docs, "DaemonSet", "gpupool-node-agent")
    for args, action in ((base_args, "report"), (container(agent)["args"], "evict")):
        params = node_agent.make_context("node-agent", [a for a in args[1:] if not a.startswith("--node-name")]).params
        assert params["risk_action"] == action
    role = one(docs, "ClusterRole", "gpupool-node-agent-evict")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]
    binding = one(docs, "ClusterRoleBinding", "gpupool-node-agent-evict")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod_spec(agent)["serviceAccountName"],
                                    "namespace": agent["metadata"]["namespace"]}]


@pytest.mark.slow
def test_node_certificates_with_the_certificate_job_make_the_signers_ca(tmp_path: Path) -> None:
    """With components/certs-bootstrap the certificate Job also makes the CA the extender's
    --remote-gpu-signer names (a second container, restricted like the first), and its Role may read
    back that one Secret, nothing more; without certs-bootstrap (cert-manager) there is nothing to
    patch and the rest renders as before."""
    from gpupool.cli.certs_cmd import certs

    remote = ("components/remote-gpu", "components/remote-gpu-node-certificates")
    (tmp_path / "with").mkdir()
    docs = with_components(tmp_path / "with", "components/certs-bootstrap", *remote)
    job = pod_spec(one(docs, "Job", "gpupool-certs-bootstrap"))
    assert job is not None and [c["name"] for c in job["containers"]] == ["bootstrap", "remote-gpu-ca"]
    args = job["containers"][1]["args"]
    assert args[:2] == ["certs", "remote-gpu-ca"]
    params = certs.commands["remote-gpu-ca"].make_context("remote-gpu-ca", args[2:]).params
    (signer,) = [a.split("=", 1)[1] for a in container(one(docs, "Deployment", "gpupool-extender"))["args"]
                 if a.startswith("--remote-gpu-signer=")]
    assert f"{params['namespace']}/{params['secret']}" == signer == "gpupool-system/gpupool-remote-gpu-ca"
    assert not restricted_violations(job)
    assert job["containers"][1]["securityContext"] == job["containers"][0]["securityContext"]
    cron = pod_spec(one(docs, "CronJob", "gpupool-certs-renew"))
    assert cron is not None and [c["name"] for c in cron["containers"]] == ["bootstrap"]  # a CA is made once
    role = one(docs, "Role", "gpupool-certs")
    plain = one(with_components(tmp_path, "components/certs-bootstrap"), "Role", "gpupool-certs")
    assert role["rules"] == [*plain["rules"], {"apiGroups": [""], "resources": ["secrets"],
                                               "resourceNames": ["gpupool-remote-gpu-ca"], "verbs": ["get"]}]
    (tmp_path / "alone").mkdir()
    alone = with_components(tmp_path / "alone", *remote)
    others = [d for d in docs if not d["metadata"]["name"].startswith("gpupool-certs")]
    assert not [d for d in alone if d["metadata"]["name"].startswith("gpupool-certs")]
    assert [(d["kind"], d["metadata"]["name"]) for d in alone] == [(d["kind"], d["metadata"]["name"]) for d in others]
