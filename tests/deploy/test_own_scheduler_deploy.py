"""gpupool's own scheduler as rendered (base/scheduler-*.yaml, components/scheduler-webhook): the
upstream kube-scheduler with one profile calling the extender with the stanza of
deploy/scheduler-config-v1.yaml, its own Lease and the Role for it, the client certificate from the
Secret the certificate components produce, and the pod-scheduler webhook reaching the path the
extender serves with the rule the extender applies (resources, opt-outs, policy).

tests/e2e/test_own_scheduler_e2e.py runs the configuration and the webhook on a real control plane.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from gpupool.api.names import ResourceNames
from gpupool.cli.extender_cmd import extender
from gpupool.extender.http.admission_review import POD_SCHEDULER_PATH
from gpupool.extender.scheduler_steering import DEFAULT_SCHEDULER, OPT_OUT_VALUE, opt_out_key
from tests.deploy.kustomize_render import DEPLOY, pod_spec, render, require_kubectl
from tests.deploy.test_kustomize import container, one

OWN = "gpupool-scheduler"


@pytest.fixture(autouse=True)
def _kubectl() -> None:
    require_kubectl()


def scheduler_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The KubeSchedulerConfiguration the Deployment mounts (found through its volume and --config)."""
    deployment = one(docs, "Deployment", OWN)
    (config_arg,) = [a.split("=", 1)[1] for a in container(deployment)["args"] if a.startswith("--config=")]
    mount = next(m for m in container(deployment)["volumeMounts"] if config_arg.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod_spec(deployment)["volumes"] if v["name"] == mount["name"])  # type: ignore[index]
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    assert config_map["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    config: dict[str, Any] = yaml.safe_load(config_map["data"][config_arg[len(mount["mountPath"]) + 1:]])
    return config


def extender_params(docs: list[dict[str, Any]]) -> dict[str, Any]:
    args = container(one(docs, "Deployment", "gpupool-extender"))["args"]
    return dict(extender.make_context("extender", args[1:]).params)


@pytest.mark.slow
@pytest.mark.parametrize("overlay", ["production", "production-cert-manager", "dev"])
def test_every_overlay_runs_the_upstream_scheduler_with_one_profile_calling_the_extender(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    config = scheduler_config(docs)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert [p["schedulerName"] for p in config["profiles"]] == [OWN] == [extender_params(docs)["scheduler_name"]]
    shipped = yaml.safe_load((DEPLOY / "scheduler-config-v1.yaml").read_text())
    assert config["extenders"] == shipped["extenders"]  # word for word: one stanza to keep right
    assert config["percentageOfNodesToScore"] == shipped["percentageOfNodesToScore"]
    assert "clientConnection" not in config  # the in-cluster ServiceAccount
    image = container(one(docs, "Deployment", OWN))["image"]
    assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.\d+\.\d+", image), image


def test_the_scheduler_is_leader_elected_on_a_lease_of_its_own_that_its_role_covers() -> None:
    docs = render("overlays/production")
    election = scheduler_config(docs)["leaderElection"]
    assert election["leaderElect"] is True and election["resourceLock"] == "leases"
    assert (election["resourceNamespace"], election["resourceName"]) == ("gpupool-system", OWN)
    assert election["resourceName"] not in ("kube-scheduler", extender_params(docs)["lease_name"])
    role = one(docs, "Role", "gpupool-scheduler-lease")
    assert role["metadata"]["namespace"] == election["resourceNamespace"]
    (rule,) = role["rules"]
    assert rule["resources"] == ["leases"] and rule["resourceNames"] == [OWN]
    assert {"get", "update"} <= set(rule["verbs"])
    deployment = one(docs, "Deployment", OWN)
    account = pod_spec(deployment)["serviceAccountName"]  # type: ignore[index]
    subject = {"kind": "ServiceAccount", "name": account, "namespace": "gpupool-system"}
    assert subject in one(docs, "RoleBinding", "gpupool-scheduler-lease")["subjects"]
    upstream = {b["roleRef"]["name"] for b in docs if b["kind"] == "ClusterRoleBinding" and subject in b["subjects"]}
    assert upstream == {"system:kube-scheduler", "system:volume-scheduler"}
    assert deployment["spec"]["replicas"] == 2


@pytest.mark.parametrize("overlay", ["production", "production-cert-manager"])
def test_the_client_certificate_is_the_secret_the_certificate_components_produce(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    (entry,) = scheduler_config(docs)["extenders"]
    deployment = one(docs, "Deployment", OWN)
    mounts = {m["name"]: m["mountPath"] for m in container(deployment)["volumeMounts"]}
    (volume,) = [v for v in pod_spec(deployment)["volumes"] if "secret" in v]  # type: ignore[index]
    files = {f"{mounts[volume['name']]}/{item['path']}": item["key"] for item in volume["secret"]["items"]}
    tls = entry["tlsConfig"]
    assert files == {tls["certFile"]: "tls.crt", tls["keyFile"]: "tls.key", tls["caFile"]: "ca.crt"}
    secret = volume["secret"]["secretName"]
    if overlay == "production":  # `gpupool certs bootstrap --secret=X` writes X-client
        job = one(docs, "Job", "gpupool-certs-bootstrap")
        (name,) = [a.split("=", 1)[1] for a in container(job)["args"] if a.startswith("--secret=")]
        assert secret == f"{name}-client"
    else:
        assert one(docs, "Certificate", "gpupool-extender-client")["spec"]["secretName"] == secret


def test_the_webhook_reaches_the_path_and_port_the_extender_serves() -> None:
    docs = render("overlays/production-cert-manager")
    (hook,) = one(docs, "MutatingWebhookConfiguration", OWN)["webhooks"]
    target = hook["clientConfig"]["service"]
    assert target["path"] == POD_SCHEDULER_PATH
    service = one(docs, "Service", target["name"])
    assert service["metadata"]["namespace"] == target["namespace"]
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == target["port"]]
    extender_container = container(one(docs, "Deployment", "gpupool-extender"))
    ports = {p["name"]: p["containerPort"] for p in extender_container["ports"]}
    assert ports[port["targetPort"]] == extender_params(docs)["admission_port"]
    notes = one(docs, "MutatingWebhookConfiguration", OWN)["metadata"]["annotations"]
    serving = one(docs, "Certificate", "gpupool-extender")
    source = f"{serving['metadata']['namespace']}/{serving['metadata']['name']}"
    assert notes["cert-manager.io/inject-ca-from"] == source


def test_the_webhook_asks_about_new_pods_only_as_the_extender_decides() -> None:
    docs = render("overlays/production-cert-manager")
    (hook,) = one(docs, "MutatingWebhookConfiguration", OWN)["webhooks"]
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    assert hook["sideEffects"] == "None" and hook["timeoutSeconds"] <= 5
    assert hook["admissionReviewVersions"] == ["v1", "v1beta1"]
    # Fail, because matchConditions narrow it to the pods only gpupool can place (docs/deploy.md)
    assert hook["failurePolicy"] == "Fail" and hook.get("objectSelector") is None
    key = opt_out_key(ResourceNames().domain)
    assert {"key": key, "operator": "NotIn", "values": [OPT_OUT_VALUE]} in hook["namespaceSelector"]["matchExpressions"]
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "gpupool-system"]} \
        in hook["namespaceSelector"]["matchExpressions"]
    conditions = {c["name"]: c["expression"] for c in hook["matchConditions"]}
    assert set(conditions) == {"not-opted-out", "on-the-default-or-gpupool-scheduler", "asks-for-gpupool-resources"}
    assert f"annotations['{key}'] == '{OPT_OUT_VALUE}'" in conditions["not-opted-out"]
    # pods already naming gpupool's scheduler are asked too: their sizes are rewritten, impossible ones refused
    on_ours = conditions["on-the-default-or-gpupool-scheduler"]
    assert f"'{DEFAULT_SCHEDULER}'" in on_ours and "'gpupool-scheduler'" in on_ours
    asked = conditions["asks-for-gpupool-resources"]
    names = re.findall(r"'([a-z0-9.]+/[a-z0-9-]+)'", asked)
    assert sorted(names) == sorted(ResourceNames().managed())  # nvidia.com/gpu only with --hami
    assert "object.spec.containers" in asked and "object.spec.initContainers" in asked
    assert "c.resources.requests" in asked and "c.resources.limits" in asked


@pytest.mark.parametrize("overlay", ["production", "dev"])
def test_overlays_with_the_bootstrap_job_ship_the_webhook_and_the_job_writes_its_ca(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    (webhook,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert webhook["metadata"]["name"] == "gpupool-scheduler"
    (job,) = [d for d in docs if d["kind"] == "Job"]
    assert "--webhook=mutating/gpupool-scheduler" in job["spec"]["template"]["spec"]["containers"][0]["args"]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpupool-certs-webhooks"]
    assert {name for rule in role["rules"] for name in rule["resourceNames"]} == {"gpupool-scheduler", "gpupool-quota"}


@pytest.mark.parametrize("overlay", ["production", "production-cert-manager", "dev"])
def test_webhooks_reach_every_replica_not_only_the_leader_and_its_certificate_names_that_service(overlay: str) -> None:
    """Admission needs no leadership; through the leader-only Service a Fail webhook would refuse every
    GPU pod for the ~12 s of a fail-over."""
    docs = render(f"overlays/{overlay}")
    hooks = [h for d in docs if d["kind"].endswith("WebhookConfiguration") for h in d["webhooks"]]
    assert hooks and {h["clientConfig"]["service"]["name"] for h in hooks} == {"gpupool-extender-admission"}
    admission = one(docs, "Service", "gpupool-extender-admission")
    assert admission["spec"]["publishNotReadyAddresses"] is True
    extender = one(docs, "Deployment", "gpupool-extender")
    assert admission["spec"]["selector"] == extender["spec"]["selector"]["matchLabels"]
    leader_only = one(docs, "Service", "gpupool-extender")
    assert not leader_only["spec"].get("publishNotReadyAddresses")
    assert [p["name"] for p in leader_only["spec"]["ports"]] == ["https"]  # the scheduler's verbs: the leader's
    if overlay == "production-cert-manager":
        names = one(docs, "Certificate", "gpupool-extender")["spec"]["dnsNames"]
        assert "gpupool-extender-admission.gpupool-system.svc" in names
    else:
        args = container(one(docs, "Job", "gpupool-certs-bootstrap"))["args"]
        assert {"--service=gpupool-extender", "--service=gpupool-extender-admission"} <= set(args)
