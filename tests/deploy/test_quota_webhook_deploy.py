"""components/quota-webhook as rendered: the webhook reaches the port the extender serves it on,
with the shipped policies, and cert-manager injects its caBundle in the cert-manager overlay."""

from __future__ import annotations

import pytest

from tests.deploy.kustomize_render import render, require_kubectl
from tests.deploy.test_kustomize import container, one

ADMISSION_PATH = "/admission/pods"


@pytest.fixture(autouse=True)
def _kubectl() -> None:
    require_kubectl()


def test_the_webhook_calls_the_port_and_path_the_extender_serves() -> None:
    docs = render("overlays/production-cert-manager")
    (hook,) = one(docs, "ValidatingWebhookConfiguration", "gpupool-quota")["webhooks"]
    extender = one(docs, "Deployment", "gpupool-extender")
    service = one(docs, "Service", "gpupool-extender")
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
    assert "gpupool-extender.gpupool-system.svc" in serving["spec"]["dnsNames"]  # the name the apiserver dials


def test_the_plain_production_overlay_has_no_webhook_without_a_ca_bundle() -> None:
    docs = render("overlays/production")
    assert not [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
