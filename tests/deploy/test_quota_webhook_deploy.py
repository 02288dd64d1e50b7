"""components/quota-webhook as rendered: each webhook reaches the port and path the extender serves it
on, with the shipped policies (the quota's fails open, the tenancy ones closed), the extender may ask
SubjectAccessReviews, and cert-manager injects the caBundle in the cert-manager overlay."""

from __future__ import annotations

import pytest

from gpupool.extender.http.admission_review import GROUP_WRITES_PATH, POD_GROUPS_PATH
from tests.deploy.kustomize_render import render, require_kubectl
from tests.deploy.test_kustomize import container, one

ADMISSION_PATH = "/admission/pods"


@pytest.fixture(autouse=True)
def _kubectl() -> None:
    require_kubectl()


def test_the_webhook_calls_the_port_and_path_the_extender_serves() -> None:
    docs = render("overlays/production-cert-manager")
    hook, _, _ = one(docs, "ValidatingWebhookConfiguration", "gpupool-quota")["webhooks"]
    extender = one(docs, "Deployment", "gpupool-extender")
    service = one(docs, "Service", "gpupool-extender-admission")
    target = hook["clientConfig"]["service"]
    assert (target["name"], target["namespace"], target["path"]) == (
        service["metadata"]["name"], service["metadata"]["namespace"], ADMISSION_PATH)
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == target["port"]]
    container_ports = {p["name"]: p["containerPort"] for p in container(extender)["ports"]}
    assert f"--admission-port={container_ports[port['targetPort']]}" in container(extender)["args"]
    policy = one(docs, "NetworkPolicy", "gpupool-extender")
    assert {"ports": [{"protocol": "TCP", "port": container_ports["admission"]}]} in policy["spec"]["ingress"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None" and hook["timeoutSeconds"] <= 5
    assert hook["admissionReviewVersions"] == ["v1", "v1beta1"]
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]


def test_cert_manager_injects_the_ca_of_the_serving_certificate() -> None:
    docs = render("overlays/production-cert-manager")
    config = one(docs, "ValidatingWebhookConfiguration", "gpupool-quota")
    serving = one(docs, "Certificate", "gpupool-extender")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
        f"{serving['metadata']['namespace']}/{serving['metadata']['name']}"
    assert "gpupool-extender-admission.gpupool-system.svc" in serving["spec"]["dnsNames"]  # what the apiserver dials


def test_the_plain_production_overlay_has_no_webhook_without_a_ca_bundle() -> None:
    docs = render("overlays/production")
    assert not [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]


def test_the_tenancy_webhooks_fail_closed_on_the_paths_the_extender_serves() -> None:
    docs = render("overlays/production-cert-manager")
    _, pods, groups = one(docs, "ValidatingWebhookConfiguration", "gpupool-quota")["webhooks"]
    assert [h["clientConfig"]["service"]["path"] for h in (pods, groups)] == [POD_GROUPS_PATH, GROUP_WRITES_PATH]
    assert pods["failurePolicy"] == groups["failurePolicy"] == "Fail"
    assert pods["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert pods["objectSelector"] == {"matchExpressions": [{"key": "gpupool.io/group", "operator": "Exists"}]}
    (condition,) = pods["matchConditions"]  # updates only when the label is set, changed or removed
    assert "request.operation == 'CREATE'" in condition["expression"]
    assert condition["expression"].count("labels['gpupool.io/group']") == 2
    assert groups["rules"] == [{"apiGroups": ["gpupool.io"], "apiVersions": ["*"],
                                "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourcegroups"],
                                "scope": "Cluster"}]
    assert "--creator-subjects-webhook" in container(one(docs, "Deployment", "gpupool-extender"))["args"]
    role = one(docs, "ClusterRole", "gpupool-extender-webhooks")
    assert role["rules"] == [{"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
                              "verbs": ["create"]}]
    binding = one(docs, "ClusterRoleBinding", "gpupool-extender-webhooks")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpupool-extender",
                                    "namespace": "gpupool-system"}]
