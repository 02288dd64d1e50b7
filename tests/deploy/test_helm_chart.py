"""charts/gpupool as the real helm lints and renders it: defaults, each value, bad values.

tests/deploy/test_helm_kustomize_parity.py proves the chart renders what deploy/kustomize renders for
every choice both offer; this module checks what only the chart has (the image tag from the chart's
appVersion, the webhooks' caBundle handling, the isolation value, HAMi and gpushare names, lending)
and that every flag it can put on a command line is one the command declares.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml

from gpupool import __version__
from gpupool.api.cluster_settings import from_config_data
from gpupool.api.names import ResourceNames
from gpupool.cli.main import cli
from tests.deploy.helm_render import CHART, find, helm, render, require_helm, template_error
from tests.deploy.kustomize_render import pod_spec

# Slow, so scripts/test-all runs it and a plain pytest does not: each case runs helm (lint, template) as a process.
pytestmark = pytest.mark.slow

#: One value per optional part, each on: lint and render must pass with every one of them.
OPTIONAL_PARTS: dict[str, dict[str, Any]] = {
    "cert-manager": {"certificates.source": "cert-manager"},
    "own-certificates": {"certificates.source": "none"},
    "ca-bundle": {"webhooks.caBundle": base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode()},
    "quota-webhook": {"webhooks.quota.enabled": True, "certificates.source": "cert-manager"},
    "no-scheduler-webhook": {"webhooks.scheduler.enabled": False},
    "no-network-policy": {"networkPolicy.enabled": False},
    "no-agent-lease": {"extender.requireAgentLease": False},
    "risk-evict": {"nodeAgent.riskAction": "evict"},
    "dmem-limits": {"nodeAgent.dmemLimits": True},
    "kube-prometheus": {"monitoring.kubePrometheus.enabled": True,
                        "monitoring.kubePrometheus.monitorLabels": {"release": "kube-prometheus-stack"}},
    "hami": {"aliases.hamiWholeCards": True, "nodeAgent.serveAliases": ["hami", "gpushare"]},
    "gpushare-mib": {"aliases.gpushareMemoryUnit": "MiB", "nodeAgent.serveAliases": ["gpushare"]},
    "lending": {"nodeAgent.lending": True},
    "shared-checkpoints": {"nodeAgent.lending": True, "nodeAgent.checkpointDir": "/mnt/gpupool-checkpoints"},
    "dra": {"nodeAgent.dra": True},
    "dra-claim-pods": {"nodeAgent.dra": True, "scheduler.claimPods": True},
    "remote-gpu": {"nodeAgent.remoteGpu.enabled": True},
    "remote-gpu-plain": {"nodeAgent.remoteGpu.enabled": True, "nodeAgent.remoteGpu.tlsSecret": "",
                         "nodeAgent.remoteGpu.allowPlain": True, "nodeAgent.remoteGpu.enforceCompute": False},
    "remote-gpu-cublas": {"nodeAgent.remoteGpu.enabled": True,
                          "nodeAgent.remoteGpu.cublas.hostPath": "/usr/local/cuda-12.6/lib64"},
    "no-lending": {"extender.lending": False},
    "isolation-shim": {"nodeAgent.isolation": "shim"},
    "isolation-mps": {"nodeAgent.isolation": "mps"},
    "isolation-none": {"nodeAgent.isolation": "none"},
    "fake-gpus": {"nodeAgent.fakeGpus": "model: Fake-T4\ncards:\n  - {memoryMiB: 15360}\n",
                  "nodeAgent.runtimeClassName": ""},
    "pull-secrets": {"imagePullSecrets": [{"name": "registry"}], "image.pullPolicy": "Always"},
    "namespaces-exist": {"namespaces.create": False},
    "rewired-default-scheduler": {"scheduler.replicas": 0, "webhooks.scheduler.enabled": False},
}


@pytest.fixture(autouse=True)
def _helm() -> None:
    require_helm()


def container(doc: dict[str, Any]) -> dict[str, Any]:
    spec = pod_spec(doc)
    assert spec is not None
    first: dict[str, Any] = spec["containers"][0]
    return first


def agent_args(values: dict[str, Any] | None = None) -> list[str]:
    return list(container(find(render(values), "DaemonSet", "gpupool-node-agent"))["args"])


def extender_args(values: dict[str, Any] | None = None) -> list[str]:
    return list(container(find(render(values), "Deployment", "gpupool-extender"))["args"])


def webhooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")]


# ----------------------------------------------------------------------------------- lint, render


def test_lint_passes_with_the_defaults() -> None:
    result = helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("part", sorted(OPTIONAL_PARTS))
def test_lint_and_render_pass_with_each_optional_part_on(part: str) -> None:
    values = OPTIONAL_PARTS[part]
    args = [arg for key, value in values.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]
    result = helm("lint", "--strict", str(CHART), *args)
    assert result.returncode == 0, result.stdout + result.stderr
    docs = render(values)
    assert {d["kind"] for d in docs} >= {"Deployment", "DaemonSet", "ConfigMap", "ValidatingAdmissionPolicy"}


def test_chart_version_and_image_tags_follow_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__  # `gpupool --version`
    gpupool_images = {c["image"] for d in render() if (spec := pod_spec(d)) is not None
                      and d["metadata"]["name"] != "gpupool-scheduler" for c in spec["containers"]}
    assert gpupool_images == {f"gpupool:{__version__}"}
    tagged = container(find(render({"image.repository": "registry.example/gpupool", "image.tag": "0.2.0"}),
                            "Deployment", "gpupool-extender"))
    assert tagged["image"] == "registry.example/gpupool:0.2.0"


def test_crds_are_the_deploy_packages_and_only_rendered_from_crds_dir() -> None:
    """Helm installs crds/ before the templates and never upgrades or deletes them (docs/helm.md)."""
    assert not [d for d in render() if d["kind"] == "CustomResourceDefinition"]
    crds = {d["metadata"]["name"]: d for d in render(crds=True) if d["kind"] == "CustomResourceDefinition"}
    shipped = {}
    for path in sorted((CHART.parents[1] / "deploy" / "crds").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc.get("kind") == "CustomResourceDefinition":
            shipped[doc["metadata"]["name"]] = doc
    assert crds == shipped


# ----------------------------------------------------------------------------- the own scheduler


def test_the_scheduler_configuration_calls_the_extenders_service() -> None:
    docs = render()
    config = yaml.safe_load(find(docs, "ConfigMap", "gpupool-scheduler-config")["data"]["config.yaml"])
    (extender,) = config["extenders"]
    url = urlsplit(extender["urlPrefix"])
    service = find(docs, "Service", "gpupool-extender")
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    (https,) = [p for p in service["spec"]["ports"] if p["name"] == "https"]
    assert url.port == https["port"] and url.scheme == "https"
    assert "--port=8888" in extender_args() and https["targetPort"] == "https"
    assert [p["schedulerName"] for p in config["profiles"]] == ["gpupool-scheduler"]
    assert sorted(r["name"] for r in extender["managedResources"]) == sorted(ResourceNames().managed())
    scheduler = find(docs, "Deployment", "gpupool-scheduler")
    assert container(scheduler)["image"] == "registry.k8s.io/kube-scheduler:v1.37.2"
    assert scheduler["spec"]["replicas"] == 2

    def restart_annotations(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, str]:
        return dict(find(docs, kind, name)["spec"]["template"]["metadata"]["annotations"])

    changed = render({"aliases.hamiWholeCards": True})
    # each component reads its configuration only at start: a change must restart it
    for kind, name in (("Deployment", "gpupool-scheduler"), ("Deployment", "gpupool-extender"),
                       ("DaemonSet", "gpupool-node-agent")):
        assert restart_annotations(changed, kind, name) != restart_annotations(docs, kind, name), name


# ------------------------------------------------------------------------------------- webhooks


def test_with_the_bootstrap_job_the_webhooks_are_installed_at_once_and_the_job_writes_their_ca() -> None:
    """No second `helm upgrade`: the Job puts the CA into both configurations by name, and may do
    nothing else to admission configurations."""
    docs = render({"webhooks.quota.enabled": True})
    assert {d["metadata"]["name"] for d in webhooks(docs)} == {"gpupool-scheduler", "gpupool-quota"}
    assert all("caBundle" not in hook["clientConfig"] for d in webhooks(docs) for hook in d["webhooks"])
    (job,) = [d for d in docs if d["kind"] == "Job"]
    (cron,) = [d for d in docs if d["kind"] == "CronJob"]
    for args in (job["spec"]["template"]["spec"]["containers"][0]["args"],
                 cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]):
        assert {"--webhook=mutating/gpupool-scheduler", "--webhook=validating/gpupool-quota"} <= set(args)
    role = find(docs, "ClusterRole", "gpupool-certs-webhooks")
    assert role["rules"] == [
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
         "resourceNames": ["gpupool-scheduler"], "verbs": ["get", "update"]},
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
         "resourceNames": ["gpupool-quota"], "verbs": ["get", "update"]}]
    binding = find(docs, "ClusterRoleBinding", "gpupool-certs-webhooks")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpupool-certs", "namespace": "gpupool-system"}]
    result = helm("install", "gpupool", str(CHART), "--dry-run=client", "--namespace", "gpupool-system")
    assert result.returncode == 0, result.stderr
    assert "helm upgrade" not in result.stdout and "certificate Job" in result.stdout  # NOTES say what to expect


def test_a_given_ca_bundle_is_set_on_every_webhook() -> None:
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
    docs = render({"webhooks.caBundle": ca, "webhooks.quota.enabled": True})
    found = webhooks(docs)
    assert {d["metadata"]["name"] for d in found} == {"gpupool-scheduler", "gpupool-quota"}
    hooks = [hook for d in found for hook in d["webhooks"]]
    assert len(hooks) == 4
    assert all(hook["clientConfig"]["caBundle"] == ca for hook in hooks)
    assert all("annotations" not in d["metadata"] for d in found)


def test_cert_manager_injects_the_ca_and_no_bundle_is_rendered() -> None:
    docs = render({"certificates.source": "cert-manager", "webhooks.quota.enabled": True})
    found = webhooks(docs)
    assert len(found) == 2
    for doc in found:
        assert doc["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": "gpupool-system/gpupool-extender"}
        assert all("caBundle" not in hook["clientConfig"] for hook in doc["webhooks"])
    assert {d["kind"] for d in docs} >= {"Issuer", "Certificate"}
    assert not [d for d in docs if d["kind"] in ("Job", "CronJob")]


def test_the_scheduler_webhook_steers_the_extenders_resources_and_its_failure_policy_is_a_value() -> None:
    (hook,) = find(render({"certificates.source": "cert-manager"}), "MutatingWebhookConfiguration",
                   "gpupool-scheduler")["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    asked = next(c["expression"] for c in hook["matchConditions"] if c["name"] == "asks-for-gpupool-resources")
    assert all(f"'{name}'" in asked for name in ResourceNames().managed())
    assert "'nvidia.com/gpu'" not in asked
    (hami,) = find(render({"certificates.source": "cert-manager", "aliases.hamiWholeCards": True,
                           "webhooks.scheduler.failurePolicy": "Ignore"}),
                   "MutatingWebhookConfiguration", "gpupool-scheduler")["webhooks"]
    assert "'nvidia.com/gpu'" in next(c["expression"] for c in hami["matchConditions"]
                                      if c["name"] == "asks-for-gpupool-resources")
    assert hami["failurePolicy"] == "Ignore"


def test_claim_pods_go_to_gpupools_scheduler_which_asks_the_extender_about_every_pod() -> None:
    """docs/dra.md, "Choosing between the extender path and the DRA path": the webhook steers pods
    naming ResourceClaims, the scheduler lists no managedResources (kube-scheduler then asks the
    extender about every pod) and ignores gpupool's resources in NodeResourcesFit instead."""
    values = {"nodeAgent.dra": True, "scheduler.claimPods": True, "certificates.source": "cert-manager"}
    docs = render(values)
    config = yaml.safe_load(find(docs, "ConfigMap", "gpupool-scheduler-config")["data"]["config.yaml"])
    (extender,) = config["extenders"]
    assert extender["managedResources"] == []
    (profile,) = config["profiles"]
    (fit,) = profile["pluginConfig"]
    assert fit["name"] == "NodeResourcesFit"
    assert sorted(fit["args"]["ignoredResources"]) == sorted(ResourceNames().managed())
    (hook,) = find(docs, "MutatingWebhookConfiguration", "gpupool-scheduler")["webhooks"]
    asked = next(c["expression"] for c in hook["matchConditions"] if c["name"] == "asks-for-gpupool-resources")
    assert "object.spec.resourceClaims" in asked
    assert "--steer-claim-pods" in extender_args(values) and "--dra-claims" in extender_args(values)
    default = yaml.safe_load(find(render({"nodeAgent.dra": True}), "ConfigMap",
                                  "gpupool-scheduler-config")["data"]["config.yaml"])
    assert "pluginConfig" not in default["profiles"][0] and default["extenders"][0]["managedResources"]
    assert "--steer-claim-pods" not in extender_args({"nodeAgent.dra": True})


def test_claim_pods_let_the_extender_read_claims_and_templates_and_only_then() -> None:
    """docs/dra.md, "Steering claim pods": the webhook reads which DeviceClass a pod's claims ask
    for from a templates' list+watch and gets a claim or template not watched yet; a DeviceClasses'
    list+watch tells admins' classes of gpupool's driver ("Selectors the extender reads")."""
    def grants(values: dict[str, Any]) -> dict[str, set[str]]:
        rules = find(render(values), "ClusterRole", "gpupool-extender-dra")["rules"]
        return {resource: set(rule["verbs"]) for rule in rules for resource in rule["resources"]}

    assert grants({"nodeAgent.dra": True, "scheduler.claimPods": True}) == {
        "resourceclaims": {"get", "list", "watch"}, "resourceclaimtemplates": {"get", "list", "watch"},
        "deviceclasses": {"list", "watch"}}
    assert grants({"nodeAgent.dra": True}) == {"resourceclaims": {"list", "watch"}}


# ---------------------------------------------------------------------------------- node agent


@pytest.mark.parametrize(("isolation", "expected"), [
    pytest.param(None, ["--isolation=auto"], id="default-auto-enforces-with-the-image-library"),
    pytest.param("none", ["--isolation=none"], id="none-the-explicit-opt-out"),
    pytest.param("mps", ["--isolation=mps"], id="mps"),
    pytest.param("shim", ["--isolation=shim",
                          "--shim-library=/usr/local/lib/python3.11/site-packages/gpupool/shim/lib/libgpupool-shim.so"],
                 id="shim-with-the-image-library"),
])
def test_the_agents_args_carry_the_isolation_value(isolation: str | None, expected: list[str]) -> None:
    args = agent_args({"nodeAgent.isolation": isolation} if isolation else None)
    assert [a for a in args if a.startswith(("--isolation", "--shim-library"))] == expected


def test_agent_values_become_its_flags() -> None:
    args = agent_args({"nodeAgent.lending": True, "nodeAgent.serveAliases": ["gpushare", "hami"],
                       "nodeAgent.riskAction": "cordon-card", "nodeAgent.extraArgs": ["--compute-mode=soft"]})
    for flag in ("--lending", "--serve-aliases=gpushare,hami", "--risk-action=cordon-card", "--compute-mode=soft"):
        assert flag in args
    assert "--lending" not in agent_args()
    docs = render({"nodeAgent.riskAction": "cordon-card"})
    assert not [d for d in docs if d["metadata"]["name"] == "gpupool-node-agent-evict"]  # only evict needs it


def test_remote_gpu_serving_passes_tls_to_the_server_and_grants_only_token_secrets() -> None:
    docs = render({"nodeAgent.remoteGpu.enabled": True})
    args = agent_args({"nodeAgent.remoteGpu.enabled": True})
    assert {"--remote-gpu-server=0.0.0.0:9420", "--remote-gpu-endpoint=$(HOST_IP):9420",
            "--remote-gpu-tls-cert=/etc/gpupool/remote-gpu-tls/tls.crt",
            "--remote-gpu-tls-key=/etc/gpupool/remote-gpu-tls/tls.key",
            "--remote-gpu-tls-ca=/etc/gpupool/remote-gpu-tls/ca.crt", "--remote-gpu-enforce-compute"} <= set(args)
    agent = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = agent["spec"]["template"]["spec"]
    assert {"name": "remote-gpu-tls", "secret": {"secretName": "gpupool-remote-gpu-tls"}} in spec["volumes"]
    assert {"name": "remote-gpu", "containerPort": 9420, "hostPort": 9420} in spec["containers"][0]["ports"]
    role = next(d for d in docs
                if d["metadata"]["name"] == "gpupool-node-agent-remote-gpu" and d["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "patch"]}]
    assert any(d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == "gpupool-agent-remote-gpu-secrets"
               for d in docs)
    off = render()
    assert not [d for d in off if "remote-gpu" in d["metadata"]["name"]]
    assert not [a for a in agent_args() if a.startswith("--remote-gpu")]
    plain = agent_args({"nodeAgent.remoteGpu.enabled": True, "nodeAgent.remoteGpu.tlsSecret": "",
                        "nodeAgent.remoteGpu.allowPlain": True})
    assert "--remote-gpu-allow-plain" in plain and not [a for a in plain if a.startswith("--remote-gpu-tls")]



def test_remote_gpu_cublas_mounts_the_host_directory_read_only_and_names_its_library() -> None:
    """nodeAgent.remoteGpu.cublas.hostPath: the directory (a CUDA toolkit's lib64) mounted read-only
    into the agent, whose server gets its libcublas.so.12 as --remote-gpu-cublas; empty by default,
    and nothing without remoteGpu.enabled."""
    values = {"nodeAgent.remoteGpu.enabled": True, "nodeAgent.remoteGpu.cublas.hostPath": "/usr/local/cuda-12.6/lib64"}
    spec = pod_spec(find(render(values), "DaemonSet", "gpupool-node-agent"))
    assert spec is not None
    agent = spec["containers"][0]
    assert "--remote-gpu-cublas=/opt/nvidia-cublas/libcublas.so.12" in agent["args"]
    assert {"name": "remote-gpu-cublas", "mountPath": "/opt/nvidia-cublas", "readOnly": True} in agent["volumeMounts"]
    assert {"name": "remote-gpu-cublas",
            "hostPath": {"path": "/usr/local/cuda-12.6/lib64", "type": "Directory"}} in spec["volumes"]
    for unset in ({"nodeAgent.remoteGpu.enabled": True},
                  {"nodeAgent.remoteGpu.cublas.hostPath": "/usr/local/cuda/lib64"}):
        spec = pod_spec(find(render(unset), "DaemonSet", "gpupool-node-agent"))
        assert spec is not None
        assert not [a for a in spec["containers"][0]["args"] if a.startswith("--remote-gpu-cublas")]
        assert "remote-gpu-cublas" not in [v["name"] for v in spec["volumes"]]
        assert "remote-gpu-cublas" not in [m["name"] for m in spec["containers"][0]["volumeMounts"]]
    assert yaml.safe_load((CHART / "values.yaml").read_text())["nodeAgent"]["remoteGpu"]["cublas"] == {"hostPath": ""}


def test_remote_gpu_node_certificates_replace_the_shared_secret_and_grant_the_signer() -> None:
    values = {"nodeAgent.remoteGpu.enabled": True, "nodeAgent.remoteGpu.nodeCertificates": True}
    docs = render(values)
    args = agent_args(values)
    assert "--remote-gpu-tls-from-cluster" in args and not [a for a in args if a.startswith("--remote-gpu-tls-")
                                                             and a != "--remote-gpu-tls-from-cluster"]
    agent = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "gpupool-node-agent")
    assert "remote-gpu-tls" not in [v["name"] for v in agent["spec"]["template"]["spec"]["volumes"]]
    extender = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpupool-extender")
    assert "--remote-gpu-signer=gpupool-system/gpupool-remote-gpu-ca" in \
        extender["spec"]["template"]["spec"]["containers"][0]["args"]
    roles = {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] in ("ClusterRole", "Role")}
    assert roles["gpupool-node-agent-remote-gpu-certificates"] == [
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["create", "get"]}]
    signer = roles["gpupool-extender-remote-gpu-signer"]
    assert {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
            "resourceNames": ["gpupool.io/remote-gpu-server"], "verbs": ["approve", "sign"]} in signer
    assert roles["gpupool-extender-remote-gpu-ca"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["gpupool-remote-gpu-ca"], "verbs": ["get"]}]
    shared = render({"nodeAgent.remoteGpu.enabled": True})  # off by default: the one Secret, no signer
    assert not [d for d in shared if d["metadata"]["name"].endswith(("-remote-gpu-signer", "-remote-gpu-certificates"))]


def test_with_node_certificates_the_certificate_job_makes_the_signers_ca() -> None:
    """No manual step: the bootstrap Job's second container runs `gpupool certs remote-gpu-ca` for the
    Secret the extender's --remote-gpu-signer names; its Role may read back that Secret only. The Job's
    name changes with it (a Job's pod template cannot change on upgrade); the CronJob is left alone."""
    values = {"nodeAgent.remoteGpu.enabled": True, "nodeAgent.remoteGpu.nodeCertificates": True}
    docs = render(values)
    (job,) = [d for d in docs if d["kind"] == "Job"]
    containers = job["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["bootstrap", "remote-gpu-ca"]
    assert containers[1]["args"] == ["certs", "remote-gpu-ca", "--namespace=gpupool-system",
                                     "--secret=gpupool-remote-gpu-ca"]
    assert containers[1]["image"] == containers[0]["image"]
    extender = find(docs, "Deployment", "gpupool-extender")
    assert "--remote-gpu-signer=gpupool-system/gpupool-remote-gpu-ca" in \
        extender["spec"]["template"]["spec"]["containers"][0]["args"]
    assert find(docs, "Role", "gpupool-certs")["rules"][-1] == {
        "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["gpupool-remote-gpu-ca"], "verbs": ["get"]}
    (cron,) = [d for d in docs if d["kind"] == "CronJob"]
    assert len(cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]) == 1
    for off in ({}, {"nodeAgent.remoteGpu.enabled": True}):  # the shared Secret: no CA, nor its read
        plain = render(off)
        (plain_job,) = [d for d in plain if d["kind"] == "Job"]
        assert len(plain_job["spec"]["template"]["spec"]["containers"]) == 1
        assert plain_job["metadata"]["name"] != job["metadata"]["name"]
        assert "gpupool-remote-gpu-ca" not in str(find(plain, "Role", "gpupool-certs")["rules"])
    no_job = render({**values, "certificates.source": "cert-manager"})  # cert-manager: make the CA by hand
    assert not [d for d in no_job if d["kind"] in ("Job", "CronJob") or d["metadata"]["name"] == "gpupool-certs"]


def test_the_certificate_jobs_name_changes_whenever_its_pod_template_does() -> None:
    """A Job's pod template cannot change, so a `helm upgrade` that changes it under the same name is
    refused. Before, the name digested the image, the pull settings and the remote GPU CA's container
    only: turning the claim-groups webhook on or off changed the Job's args under the same name."""
    variants: list[dict[str, object]] = [
        {}, {"webhooks.claimGroups.enabled": True},
        {"nodeAgent.remoteGpu.enabled": True, "nodeAgent.remoteGpu.nodeCertificates": True},
        {"webhooks.claimGroups.enabled": True, "nodeAgent.remoteGpu.enabled": True,
         "nodeAgent.remoteGpu.nodeCertificates": True},
        {"image.pullPolicy": "Always"}, {"imagePullSecrets[0].name": "registry"},
        {"nodeAgent.remoteGpu.enabled": True},  # the shared Secret: the same Job as the default
    ]
    templates: dict[str, list[object]] = {}
    for values in variants:
        (job,) = [d for d in render(values) if d["kind"] == "Job"]
        templates.setdefault(job["metadata"]["name"], []).append(job["spec"]["template"])
    assert all(all(t == same[0] for t in same) for same in templates.values()), "one name, two templates"
    distinct = {json.dumps(t, sort_keys=True) for same in templates.values() for t in same}
    assert len(templates) == len(distinct) == len(variants) - 1


def test_a_checkpoint_directory_is_the_agents_flag_and_a_host_mount_that_sees_later_mounts() -> None:
    values = {"nodeAgent.lending": True, "nodeAgent.checkpointDir": "/mnt/gpupool-checkpoints"}
    assert "--checkpoint-dir=/mnt/gpupool-checkpoints" in agent_args(values)
    agent = next(d for d in render(values) if d["kind"] == "DaemonSet")
    spec = agent["spec"]["template"]["spec"]
    assert {"name": "checkpoints", "hostPath": {"path": "/mnt/gpupool-checkpoints", "type": "DirectoryOrCreate"}} \
        in spec["volumes"]
    assert {"name": "checkpoints", "mountPath": "/mnt/gpupool-checkpoints", "mountPropagation": "HostToContainer"} \
        in spec["containers"][0]["volumeMounts"]
    assert not [a for a in agent_args({"nodeAgent.lending": True}) if a.startswith("--checkpoint-dir")]


def test_a_checkpoint_retention_is_the_agents_flag_only_when_set() -> None:
    assert "--checkpoint-retention=36h" in agent_args({"nodeAgent.lending": True,
                                                      "nodeAgent.checkpointRetention": "36h"})
    assert "--checkpoint-retention=0" in agent_args({"nodeAgent.lending": True, "nodeAgent.checkpointRetention": "0"})
    assert not [a for a in agent_args({"nodeAgent.lending": True}) if a.startswith("--checkpoint-retention")]


def test_infrastructure_holders_are_the_agents_flag_only_when_set() -> None:
    assert not [a for a in agent_args() if a.startswith("--infrastructure-holders")]  # the agent's default
    assert "--infrastructure-holders=" in agent_args({"nodeAgent.infrastructureHolders": []})  # none
    assert "--infrastructure-holders=nvidia-persistenced,my-daemon" in agent_args(
        {"nodeAgent.infrastructureHolders": ["nvidia-persistenced", "my-daemon"]})
    agent = container(find(render({"nodeAgent.infrastructureHolders": []}), "DaemonSet", "gpupool-node-agent"))
    assert all(isinstance(m, dict) for m in agent["volumeMounts"])  # the flag once sat among the mounts too


def test_infrastructure_namespaces_are_the_agents_flag_only_when_listed() -> None:
    assert not [a for a in agent_args() if a.startswith("--infrastructure-namespaces")]  # none by default
    assert "--infrastructure-namespaces=gpu-operator,dcgm" in agent_args(
        {"nodeAgent.infrastructureNamespaces": ["gpu-operator", "dcgm"]})


def test_extender_values_become_its_flags() -> None:
    args = extender_args({"extender.lending": False})
    assert "--no-lending" in args
    assert "--no-lending" not in extender_args()


def test_the_extenders_rules_go_into_the_cluster_configmap_not_flags() -> None:
    """policy, requireAgentLease and unconfirmedTimeout are read from gpupool-cluster by the extender
    and by kubectl gpupool alike (docs/cluster-config.md); a flag would make the plugin explain and
    count with another rule."""
    values = {"extender.policy": "binpack", "extender.requireAgentLease": False, "extender.unconfirmedTimeout": 90.5}
    data = find(render(values), "ConfigMap", "gpupool-cluster")["data"]
    assert (data["policy"], data["requireAgentLease"], data["unconfirmedTimeout"]) == ("binpack", "false", "90.5")
    assert from_config_data(data).unconfirmed_timeout == 90.5
    for args in (extender_args(values), extender_args()):
        assert not [a for a in args if a.startswith(("--policy", "--require-agent-lease", "--no-require-agent-lease",
                                                     "--unconfirmed-timeout"))]

    def checksums(docs: list[dict[str, Any]]) -> tuple[str, str]:
        return tuple(find(docs, kind, name)["spec"]["template"]["metadata"]["annotations"]["checksum/cluster-config"]
                     for kind, name in (("Deployment", "gpupool-extender"), ("DaemonSet", "gpupool-node-agent")))
    extender, agent = checksums(render())
    changed_extender, changed_agent = checksums(render(values))
    assert changed_extender != extender and changed_agent == agent  # a new policy restarts no node agent


def test_shared_settings_are_the_cluster_configmap() -> None:
    """HAMi, the gpushare unit and the priority threshold are settings every component must share:
    one ConfigMap (docs/cluster-config.md), not flags that could differ between them."""
    default = find(render(), "ConfigMap", "gpupool-cluster")["data"]
    assert default == {"resourceDomain": "gpupool.io", "gpushareMemoryUnit": "GiB", "highPriorityThreshold": "1000",
                       "hami": "false", "agentLeaseNamespace": "gpupool-node-lease", "policy": "gpupool",
                       "requireAgentLease": "true", "unconfirmedTimeout": "300"}
    changed = find(render({"aliases.hamiWholeCards": True, "aliases.gpushareMemoryUnit": "MiB",
                           "cluster.highPriorityThreshold": 500}), "ConfigMap", "gpupool-cluster")["data"]
    assert (changed["hami"], changed["gpushareMemoryUnit"], changed["highPriorityThreshold"]) == ("true", "MiB", "500")
    for args in (extender_args({"aliases.hamiWholeCards": True}), agent_args({"aliases.hamiWholeCards": True})):
        assert not [a for a in args if a.startswith(("--hami", "--gpushare-memory-unit", "--high-priority"))]


@pytest.mark.parametrize("part", sorted(OPTIONAL_PARTS))
def test_every_flag_the_chart_renders_is_one_the_command_declares(part: str) -> None:
    for doc in render(OPTIONAL_PARTS[part]):
        spec = pod_spec(doc)
        if spec is None or doc["metadata"]["name"] == "gpupool-scheduler":
            continue
        args = container(doc)["args"]
        command: click.Command | None = cli.get_command(click.Context(cli), args[0])
        rest = args[1:]
        while isinstance(command, click.Group):
            command, rest = command.get_command(click.Context(command), rest[0]), rest[1:]
        assert command is not None, args
        declared = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
        unknown = [a for a in rest if a.startswith("-") and a.split("=", 1)[0] not in declared]
        assert unknown == [], f"{doc['kind']} {doc['metadata']['name']}: gpupool {args[0]} has no {unknown}"


def test_fake_gpus_are_a_configmap_the_agent_reads(tmp_path: Path) -> None:
    text = "model: Fake-T4\ncards:\n  - {memoryMiB: 15360}\n"
    docs = render({"nodeAgent.fakeGpus": text, "nodeAgent.runtimeClassName": ""})
    assert find(docs, "ConfigMap", "gpupool-fake-gpus")["data"] == {"gpus.yaml": text}
    agent = find(docs, "DaemonSet", "gpupool-node-agent")
    spec = pod_spec(agent)
    assert spec is not None and "runtimeClassName" not in spec
    assert "--fake-gpus=/etc/gpupool/fake/gpus.yaml" in container(agent)["args"]
    mount = next(m for m in container(agent)["volumeMounts"] if m["name"] == "fake-gpus")
    assert mount["mountPath"] == "/etc/gpupool/fake"


# ---------------------------------------------------------------------------------- bad values


@pytest.mark.parametrize(("values", "message"), [
    pytest.param({"nodeAgent.isolation": "off"}, "'/nodeAgent/isolation': value must be one of 'auto', 'shim', 'mps', "
                 "'none'", id="isolation"),
    pytest.param({"certificates.source": "vault"}, "'/certificates/source': value must be one of", id="certificates"),
    pytest.param({"nodeAgent.riskAction": "kill"}, "'/nodeAgent/riskAction': value must be one of", id="risk-action"),
    pytest.param({"nodeAgent.serveAliases": ["nvidia"]}, "'/nodeAgent/serveAliases/0': value must be one of",
                 id="aliases"),
    pytest.param({"webhooks.scheduler.failurePolicy": "fail"}, "value must be one of 'Fail', 'Ignore'",
                 id="failure-policy"),
    pytest.param({"aliases.gpushareMemoryUnit": "GB"}, "value must be one of 'GiB', 'MiB'", id="gpushare-unit"),
    pytest.param({"cluster.highPriorityThreshold": "high"},
                 "'/cluster/highPriorityThreshold': got string, want integer", id="priority-threshold"),
    pytest.param({"extender.replicas": "two"}, "'/extender/replicas': got string, want integer", id="replicas"),
    pytest.param({"nodeagent": {"isolation": "none"}}, "additional properties 'nodeagent' not allowed",
                 id="misspelt-value-name"),
    pytest.param({"nodeAgent.isolaton": "none"}, "additional properties 'isolaton' not allowed", id="misspelt-key"),
    pytest.param({"nodeAgent.remoteGpu.enabled": True, "nodeAgent.remoteGpu.tlsSecret": ""},
                 "nodeAgent.remoteGpu needs tlsSecret or nodeCertificates (the server refuses plain TCP off loopback) "
                 "or allowPlain: true",
                 id="remote-gpu-without-tls"),
    pytest.param({"nodeAgent.remoteGpu.port": 0}, "'/nodeAgent/remoteGpu/port'", id="remote-gpu-port"),
    pytest.param({"nodeAgent.checkpointDir": "checkpoints"}, "'/nodeAgent/checkpointDir'",
                 id="relative-checkpoint-dir"),
    pytest.param({"nodeAgent.checkpointRetention": "a week"}, "'/nodeAgent/checkpointRetention'",
                 id="checkpoint-retention-not-a-duration"),
    pytest.param({"nodeAgent.checkpointRetention": 0}, "'/nodeAgent/checkpointRetention'",
                 id="checkpoint-retention-a-number-not-a-string"),
    pytest.param({"nodeAgent.infrastructureHolders": ["/usr/bin/nvidia-persistenced"]},
                 "'/nodeAgent/infrastructureHolders/0'", id="infrastructure-holder-with-a-directory"),
    pytest.param({"nodeAgent.infrastructureNamespaces": ["GPU Operator"]},
                 "'/nodeAgent/infrastructureNamespaces/0'", id="infrastructure-namespace-not-a-name"),
    pytest.param({"nodeAgent.dra": True, "nodeAgent.riskAction": "evict"},
                 "nodeAgent.dra cannot be combined with nodeAgent.riskAction \"evict\" yet", id="dra-with-evict"),
    pytest.param({"scheduler.claimPods": True}, "scheduler.claimPods needs nodeAgent.dra", id="claim-pods-without-dra"),
])
def test_bad_values_are_refused_with_the_reason(values: dict[str, Any], message: str) -> None:
    """values.schema.json: a wrong type, an unknown choice or a misspelt name (which Helm would
    otherwise ignore silently) stops install, upgrade and template with the value's path."""
    assert message in template_error(values)


def test_the_packaged_chart_carries_the_linked_files(tmp_path: Path) -> None:
    """crds/ and the dashboard are links into deploy/ (one copy); `helm package` must put their
    contents into the archive users install from, so it renders as the directory does."""
    result = helm("package", str(CHART), "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (archive,) = tmp_path.glob("gpupool-*.tgz")
    values = ["--set-json", "monitoring.kubePrometheus.enabled=true"]
    packaged = helm("template", "gpupool", str(archive), "--include-crds", *values)
    directory = helm("template", "gpupool", str(CHART), "--include-crds", *values)
    assert packaged.returncode == 0, packaged.stderr
    assert packaged.stdout == directory.stdout
    assert "CustomResourceDefinition" in packaged.stdout and "gpupool-dashboard.json" in packaged.stdout


def test_pull_secrets_and_policy_reach_every_pod() -> None:
    docs = render({**OPTIONAL_PARTS["pull-secrets"], "nodeAgent.fakeGpus": "cards: []\n"})
    pods = [(d["metadata"]["name"], spec) for d in docs if (spec := pod_spec(d)) is not None]
    assert len(pods) == 5  # extender, scheduler, agent, certificate Job and CronJob
    for name, spec in pods:
        assert spec["imagePullSecrets"] == [{"name": "registry"}], name
        assert all(c["imagePullPolicy"] == "Always" for c in spec["containers"] if "gpupool" in c["image"]), name
