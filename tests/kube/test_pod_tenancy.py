"""A pod's tenancy from its object: namespace, ServiceAccount, group label and card controls."""

from __future__ import annotations

import pytest

from gpupool.api.tenancy import TenancyNames
from gpupool.core.card_scope import CardScope, CardSet
from gpupool.kube.tenancy import PodTenancy, namespace_defaults, pod_tenancy
from gpupool.kube.translate import TranslationError

NAMES = TenancyNames()


def pod(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        account: str | None = None) -> dict[str, object]:
    spec: dict[str, object] = {"containers": []}
    if account:
        spec["serviceAccountName"] = account
    return {"metadata": {"name": "p", "namespace": "team", "labels": labels or {}, "annotations": annotations or {}},
            "spec": spec}


def test_plain_pod() -> None:
    assert pod_tenancy(pod(), NAMES) == PodTenancy("team", "default", "", None)


def test_group_label_account_and_controls() -> None:
    found = pod_tenancy(pod({"gpupool.io/group": "g"}, {"gpupool.io/gpu-uuids": "GPU-1,GPU-2",
                                                       "nvidia.com/nouse-gpuuuid": "GPU-3",
                                                       "gpupool.io/avoid-gpu-models": "T4, P100"}, "bot"), NAMES)
    assert (found.group, found.service_account) == ("g", "bot")
    assert found.controls == CardScope("the GPUs the pod's annotations allow",
                                       (CardSet(uuids=frozenset({"GPU-1", "GPU-2"})),),
                                       CardSet(uuids=frozenset({"GPU-3"})), frozenset({"T4", "P100"}))


def test_a_broken_annotation_is_a_translation_error() -> None:
    with pytest.raises(TranslationError, match=r"pod team/p: annotation gpupool\.io/gpu-uuids"):
        pod_tenancy(pod(annotations={"gpupool.io/gpu-uuids": "GPU-1,\x1b[31m"}), NAMES)


def test_namespace_defaults_from_annotation_or_label() -> None:
    ns = {"metadata": {"name": "team", "annotations": {"gpupool.io/default-groups": "b, a"}}}
    assert namespace_defaults(ns, NAMES) == ("team", ("a", "b"), None)
    ns = {"metadata": {"name": "team", "labels": {"gpupool.io/default-groups": "a"}}}
    assert namespace_defaults(ns, NAMES) == ("team", ("a",), None)
    assert namespace_defaults({"metadata": {"name": "x"}}, NAMES) == ("x", (), None)
    _, groups, problem = namespace_defaults({"metadata": {"name": "x", "annotations": {
        "gpupool.io/default-groups": "\x00"}}}, NAMES)
    assert groups == () and problem is not None
