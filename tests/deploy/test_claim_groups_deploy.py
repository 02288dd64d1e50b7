"""components/dra-claim-groups and the chart's webhooks.claimGroups: the webhook calls the path the
extender serves, asks about the claims of gpupool's DeviceClass only, fails closed, and with the
chart's certificate Job gets its CA written (the Job may update it by name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpupool.api.dra import driver_name
from gpupool.extender.http.admission_review import CLAIM_GROUPS_PATH
from tests.deploy import helm_render

COMPONENT = Path(__file__).resolve().parents[2] / "deploy" / "kustomize" / "components" / "dra-claim-groups"


def shipped() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((COMPONENT / "webhook.yaml").read_text())
    return doc


def test_the_webhook_asks_the_extenders_path_about_new_claims_and_fails_closed() -> None:
    (hook,) = shipped()["webhooks"]
    assert hook["clientConfig"]["service"]["path"] == CLAIM_GROUPS_PATH
    assert hook["rules"] == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["resourceclaims"], "scope": "Namespaced"}]
    assert (hook["failurePolicy"], hook["matchPolicy"], hook["sideEffects"]) == ("Fail", "Equivalent", "None")
    (condition,) = hook["matchConditions"]
    assert condition["expression"].count(f"['{driver_name()}']") == 2  # exactly and firstAvailable


def test_the_charts_certificate_job_writes_the_ca_into_the_claim_groups_webhook() -> None:
    helm_render.require_helm()
    docs = helm_render.render({"webhooks.claimGroups.enabled": True})
    (hook,) = helm_render.find(docs, "MutatingWebhookConfiguration", "gpupool-claim-groups")["webhooks"]
    assert hook == {**shipped()["webhooks"][0], "matchConditions": hook["matchConditions"]}
    jobs = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Job"]
    jobs += [d["spec"]["jobTemplate"]["spec"]["template"]["spec"] for d in docs if d["kind"] == "CronJob"]
    assert len(jobs) == 2
    assert all("--webhook=mutating/gpupool-claim-groups" in j["containers"][0]["args"] for j in jobs)
    role = helm_render.find(docs, "ClusterRole", "gpupool-certs-webhooks")
    assert "gpupool-claim-groups" in role["rules"][0]["resourceNames"]
    off = helm_render.render({})
    assert not [d for d in off if d["metadata"]["name"] == "gpupool-claim-groups"]
    assert "gpupool-claim-groups" not in helm_render.find(off, "ClusterRole", "gpupool-certs-webhooks")["rules"][0][
        "resourceNames"]
