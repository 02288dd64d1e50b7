"""The ResourceGroup and GpuQuota codecs: typed values, and broken objects refused with the field named."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.quota import decode_quota, refusing_quota
from gpupool.api.tenancy import GroupNode, Subject, TenancyError, decode_group
from gpupool.core.quota import Limits, Quota, quota_verdict
from gpupool.core.usage import Amounts


def group_obj(spec: Any, name: str = "g") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def quota_obj(spec: Any, namespace: str | None = "ns") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "q"}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"metadata": meta, "spec": spec}


def test_group_decodes_nodes_gpus_and_subjects() -> None:
    found = decode_group(group_obj({
        "shared": True,
        "nodes": [{"name": "n1", "gpus": ["GPU-1", "GPU-2"]}, {"name": "n2"}],
        "subjects": [{"kind": "Namespace", "name": "team"},
                     {"kind": "ServiceAccount", "namespace": "ci", "name": "bot"}, {"kind": "User", "name": "al"}]}))
    assert found.nodes == (GroupNode("n1", frozenset({"GPU-1", "GPU-2"})), GroupNode("n2", None))
    assert found.shared
    assert found.subjects[1] == Subject("ServiceAccount", "bot", "ci")
    assert found.admits("team", "default") and found.admits("ci", "bot")
    assert not found.admits("ci", "default") and not found.admits("other", "bot")
    assert decode_group(group_obj({})).admits("anyone", "default")  # no subjects: open to every pod


@pytest.mark.parametrize(("spec", "message"), [
    pytest.param({"shared": "no"}, "ResourceGroup g: spec.shared: expected true or false, got 'no'", id="shared"),
    pytest.param({"nodes": {"n1": None}}, "ResourceGroup g: spec.nodes: expected a list, got dict", id="nodes-map"),
    pytest.param({"nodes": [{"name": "n1"}, {"name": "n1"}]}, "ResourceGroup g: spec.nodes[1].name: node n1 is "
                 "listed twice", id="node-twice"),
    pytest.param({"nodes": [{"name": "n1", "gpus": []}]}, "ResourceGroup g: spec.nodes[0].gpus: empty; list the "
                 "node's GPUs of the group, or omit gpus for all of them", id="no-gpus"),
    pytest.param({"nodes": [{"name": "n1", "gpus": ["a", "a"]}]}, "ResourceGroup g: spec.nodes[0].gpus: a GPU is "
                 "listed twice", id="gpu-twice"),
    pytest.param({"nodes": [{"name": "bad\nname"}]}, "ResourceGroup g: spec.nodes[0].name 'bad\\nname': must not "
                 "contain control or separator characters (found '\\n')", id="control-character"),
    pytest.param({"subjects": [{"kind": "Role", "name": "x"}]}, "ResourceGroup g: spec.subjects[0].kind: one of "
                 "Namespace, ServiceAccount, User, Group, got 'Role'", id="subject-kind"),
    pytest.param({"subjects": [{"kind": "ServiceAccount", "name": "x"}]}, "ResourceGroup g: "
                 "spec.subjects[0].namespace: expected a string, got NoneType", id="sa-without-namespace"),
    pytest.param([], "ResourceGroup g: spec: expected an object, got list", id="spec-list"),
])
def test_broken_groups_are_refused_with_the_field(spec: Any, message: str) -> None:
    with pytest.raises(TenancyError) as caught:
        decode_group(group_obj(spec))
    assert str(caught.value) == message


def test_quota_decodes_into_the_cores_quota() -> None:
    found = decode_quota(quota_obj({"hard": {"memoryMiB": 1024, "computePercent": 150},
                                    "models": {"T4": {"wholeGpus": 2}}, "pools": ["public", "wx"]}))
    assert found == Quota("ns/q", "ns", Limits(1024, 1500, None), (("T4", Limits(None, None, 2)),),
                          frozenset({"public", "wx"}))


@pytest.mark.parametrize(("obj", "message"), [
    pytest.param(quota_obj({"hard": {"wholeGpus": -1}}), "GpuQuota ns/q: spec.hard.wholeGpus: must be within "
                 "0..2147483648, got -1", id="negative"),
    pytest.param(quota_obj({"hard": {"memoryMiB": True}}), "GpuQuota ns/q: spec.hard.memoryMiB: expected an "
                 "integer, got True", id="boolean"),
    pytest.param(quota_obj({"hard": {"gpus": 1}}), "GpuQuota ns/q: spec.hard: unknown field(s) 'gpus'; known: "
                 "memoryMiB, computePercent, wholeGpus", id="typo"),
    pytest.param(quota_obj({"models": {"T4": 2}}), "GpuQuota ns/q: spec.models.T4: expected an object, got int",
                 id="model-not-object"),
    pytest.param(quota_obj({}, namespace=None), "GpuQuota q: metadata.namespace: missing (GpuQuota is namespaced)",
                 id="no-namespace"),
])
def test_broken_quotas_are_refused_with_the_field(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(TenancyError) as caught:
        decode_quota(obj)
    assert str(caught.value) == message


def test_an_unreadable_quota_refuses_every_gpu_request() -> None:
    stand_in = refusing_quota("ns", "q", "broken")
    for asked in (Amounts(1, 0, 0), Amounts(0, 1, 0), Amounts(100, 1000, 1)):
        assert quota_verdict([stand_in], {}, {"T4": asked}) is not None
