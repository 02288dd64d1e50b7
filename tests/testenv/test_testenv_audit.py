"""The audit log the control plane keeps of one identity: its policy, its flags, and how it is read."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpupool.testenv.audit import AUDITED_USER, read_audit_log, render_audit_policy
from gpupool.testenv.controlplane import apiserver_args


def event(audit_id: str, stage: str, verb: str = "get", user: str = AUDITED_USER, **ref: str) -> dict[str, Any]:
    return {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata", "auditID": audit_id,
            "stage": stage, "verb": verb, "requestURI": f"/api/v1/{ref.get('resource', 'pods')}",
            "user": {"username": user}, "userAgent": "gpupool-node-agent/n1",
            "requestReceivedTimestamp": f"2024-05-01T10:00:0{audit_id}.250000Z",
            "objectRef": {"resource": "pods", "apiVersion": "v1", **ref}}


def test_the_policy_records_the_audited_user_only_and_without_bodies() -> None:
    policy = yaml.safe_load(render_audit_policy())
    assert policy["kind"] == "Policy" and policy["apiVersion"] == "audit.k8s.io/v1"
    assert policy["rules"] == [{"level": "Metadata", "users": [AUDITED_USER]}, {"level": "None"}]
    assert policy["omitStages"] == ["RequestReceived"]


def test_the_apiserver_audits_only_when_given_a_policy_and_a_log(tmp_path: Path) -> None:
    def args(policy: Path | None, log: Path | None) -> list[str]:
        return apiserver_args(etcd_url="http://127.0.0.1:1", port=2, cert=tmp_path / "c", key=tmp_path / "k",
                              sa_key=tmp_path / "sa", token_file=tmp_path / "t", cert_dir=tmp_path,
                              audit_policy=policy, audit_log=log)

    assert not [a for a in args(None, None) if a.startswith("--audit")]
    audited = args(tmp_path / "p.yaml", tmp_path / "a.log")
    assert f"--audit-policy-file={tmp_path / 'p.yaml'}" in audited
    assert f"--audit-log-path={tmp_path / 'a.log'}" in audited
    assert "--audit-log-mode=blocking" in audited  # written as requests happen, not batched later


def test_each_request_is_read_once_and_an_open_watch_is_not_complete(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    lines = [
        event("1", "ResponseComplete", "list", namespace=""),
        event("2", "ResponseStarted", "watch"),
        event("3", "ResponseStarted", "patch", namespace="ns", name="p1"),
        event("3", "ResponseComplete", "patch", namespace="ns", name="p1"),
        event("4", "ResponseComplete", "get", user="admin"),  # someone else
        event("5", "ResponseComplete", "create", namespace="ns", name="p1", subresource="binding"),
    ]
    log.write_text("".join(json.dumps(e) + "\n" for e in lines) + "\n")
    got = read_audit_log(log)
    assert [(r.audit_id, r.what, r.complete) for r in got] == [
        ("1", "list pods", True), ("2", "watch pods", False), ("3", "patch pods", True),
        ("5", "create pods/binding", True)]
    assert (got[2].namespace, got[2].name, got[2].user_agent) == ("ns", "p1", "gpupool-node-agent/n1")
    assert got[2].received == datetime(2024, 5, 1, 10, 0, 3, 250000, tzinfo=UTC).timestamp()


def test_no_log_yet_reads_as_no_requests(tmp_path: Path) -> None:
    assert read_audit_log(tmp_path / "absent.log") == []


def test_the_answers_status_code_is_read_from_the_completed_stage(tmp_path: Path) -> None:
    """A late write's outcome (the partition e2e counts binds answered 201 and refused 409)."""
    log = tmp_path / "audit.log"
    lines = [
        event("1", "ResponseStarted", "watch"),
        {**event("2", "ResponseComplete", "create", namespace="ns", name="p1", subresource="binding"),
         "responseStatus": {"metadata": {}, "code": 201}},
        {**event("3", "ResponseComplete", "create", namespace="ns", name="p2", subresource="binding"),
         "responseStatus": {"metadata": {}, "status": "Failure", "reason": "Conflict", "code": 409}},
    ]
    log.write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert [(r.audit_id, r.code) for r in read_audit_log(log)] == [("1", 0), ("2", 201), ("3", 409)]
