"""The pod-scheduler webhook's injection of the GPU client and its grant into a remote-share pod
(gpupool/extender/remote_injection.py): the JSON patch, applied to the pod as the apiserver would."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gpupool.api.names import ResourceNames
from gpupool.extender.admission import Verdict
from gpupool.extender.remote_injection import (
    BLAS_LIBRARY,
    BLAS_LT_LIBRARY,
    CLIENT_LIBRARY,
    GRANT_DIR,
    GRANT_VOLUME,
    INIT_CONTAINER,
    INIT_RESOURCES,
    INIT_SECURITY,
    LIBRARY_DIR,
    LIBRARY_VOLUME,
    PRELOAD,
    RUNTIME_LIBRARY,
    SHARE_ENV,
    RemoteInjection,
)

NAMES = ResourceNames()
IMAGE = "registry.example/gpupool:1.0"


def injection() -> RemoteInjection:
    return RemoteInjection(NAMES, IMAGE, suffix=lambda: "x7k2q")


def apply(doc: Any, patch: Sequence[Mapping[str, Any]]) -> Any:
    """RFC 6902 ``add`` and ``replace``, the two operations the webhook sends."""
    doc = copy.deepcopy(doc)
    for op in patch:
        assert op["op"] in ("add", "replace"), op
        *parents, last = op["path"].lstrip("/").split("/")
        target = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            if last == "-":
                target.append(op["value"])
            elif op["op"] == "add":
                target.insert(int(last), op["value"])
            else:
                target[int(last)] = op["value"]
        else:
            assert op["op"] == "add" or last in target, op
            target[last] = op["value"]
    return doc


def remote_pod(**meta: Any) -> dict[str, Any]:
    """A Deployment's pod as the apiserver sends it to the webhook: ``generateName``, no name."""
    return {"metadata": {"generateName": "train-6d4f9-", "annotations": {"gpupool.io/remote-gpu": "true"}, **meta},
            "spec": {"containers": [
                {"name": "log", "image": "busybox"},
                {"name": "main", "image": "trainer", "resources": {"limits": {NAMES.gpu_mem: "32"}}}]}}


def test_a_generate_name_pod_gets_a_name_the_client_library_and_its_grant_by_that_name() -> None:
    pod = remote_pod()
    verdict = injection().verdict(pod)
    assert verdict.allowed and not verdict.warnings
    out = apply(pod, verdict.patch)
    assert out["metadata"]["name"] == "train-6d4f9-x7k2q"
    assert out["spec"]["volumes"] == [
        {"name": GRANT_VOLUME, "secret": {"secretName": "train-6d4f9-x7k2q-gpupool-remote", "optional": True}},
        {"name": LIBRARY_VOLUME, "emptyDir": {}}]
    [init] = out["spec"]["initContainers"]
    assert init == {
        "name": INIT_CONTAINER, "image": IMAGE,
        "command": ["gpupool", "remote-gpu", "install-client", "--into", LIBRARY_DIR, "--grant", GRANT_DIR],
        "env": [{"name": SHARE_ENV, "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['gpupool.io/remote-share-v1']"}}}],
        "volumeMounts": [{"name": LIBRARY_VOLUME, "mountPath": LIBRARY_DIR},
                         {"name": GRANT_VOLUME, "mountPath": GRANT_DIR, "readOnly": True}],
        "resources": INIT_RESOURCES, "securityContext": INIT_SECURITY}
    log, main = out["spec"]["containers"]
    assert log == {"name": "log", "image": "busybox"}  # only the GPU container gets the client
    assert main["env"] == [{"name": "GPUPOOL_REMOTE_DIR", "value": GRANT_DIR},
                           {"name": "LD_PRELOAD", "value": PRELOAD}]
    # the client, then gpupool's CUDA runtime and cuBLAS (whose libcuda.so.1 is then the client), then
    # its cuBLASLt (so NVIDIA's, which crashes on gpupool's cuBLAS handles, is never loaded)
    assert PRELOAD.split(":") == [CLIENT_LIBRARY, RUNTIME_LIBRARY, BLAS_LIBRARY, BLAS_LT_LIBRARY] == [
        f"{LIBRARY_DIR}/libcuda.so.1", f"{LIBRARY_DIR}/libcudart.so.12", f"{LIBRARY_DIR}/libcublas.so.12",
        f"{LIBRARY_DIR}/libcublasLt.so.12"]
    assert main["volumeMounts"] == [{"name": GRANT_VOLUME, "mountPath": GRANT_DIR, "readOnly": True},
                                    {"name": LIBRARY_VOLUME, "mountPath": LIBRARY_DIR, "readOnly": True}]
    assert injection().verdict(out) == Verdict(True)  # called again (reinvocation): nothing more


def test_a_named_pod_keeps_its_name_and_its_lists_are_appended_to() -> None:
    pod = remote_pod(name="train-0")
    del pod["metadata"]["generateName"]
    main = pod["spec"]["containers"][1]
    main["env"] = [{"name": "A", "value": "1"}, {"name": "LD_PRELOAD", "value": "/opt/mine.so"}]
    main["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    pod["spec"]["initContainers"] = [{"name": "fetch", "image": "curl"}]
    out = apply(pod, injection().verdict(pod).patch)
    assert out["metadata"]["name"] == "train-0" and "generateName" not in out["metadata"]
    assert [v["name"] for v in out["spec"]["volumes"]] == ["data", GRANT_VOLUME, LIBRARY_VOLUME]
    assert out["spec"]["volumes"][1]["secret"]["secretName"] == "train-0-gpupool-remote"
    assert [c["name"] for c in out["spec"]["initContainers"]] == [INIT_CONTAINER, "fetch"]  # first
    env = out["spec"]["containers"][1]["env"]
    assert env == [{"name": "A", "value": "1"}, {"name": "LD_PRELOAD", "value": f"{PRELOAD}:/opt/mine.so"},
                   {"name": "GPUPOOL_REMOTE_DIR", "value": GRANT_DIR}]
    assert [m["name"] for m in out["spec"]["containers"][1]["volumeMounts"]] == ["data", GRANT_VOLUME, LIBRARY_VOLUME]


def test_a_preload_from_elsewhere_is_left_with_a_warning() -> None:
    pod = remote_pod()
    pod["spec"]["containers"][1]["env"] = [{"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {
        "name": "c", "key": "k"}}}]
    verdict = injection().verdict(pod)
    out = apply(pod, verdict.patch)
    assert out["spec"]["containers"][1]["env"][0]["valueFrom"]
    assert [e["name"] for e in out["spec"]["containers"][1]["env"]] == ["LD_PRELOAD", "GPUPOOL_REMOTE_DIR"]
    assert len(verdict.warnings) == 1 and PRELOAD in verdict.warnings[0]


def test_the_init_container_passes_pod_securitys_restricted_profile() -> None:
    from tests.deploy.pod_security import restricted_violations

    pod = remote_pod()
    out = apply(pod, injection().verdict(pod).patch)
    out["spec"]["containers"] = []  # the user's containers are theirs to make restricted
    assert restricted_violations(out["spec"]) == []


def test_a_long_generate_name_is_cut_as_the_apiserver_cuts_it() -> None:
    pod = remote_pod(generateName="p" * 80)
    out = apply(pod, injection().verdict(pod).patch)
    assert out["metadata"]["name"] == "p" * 58 + "x7k2q"


def test_names_are_random_from_the_apiservers_alphabet() -> None:
    names = {apply(remote_pod(), RemoteInjection(NAMES, IMAGE).verdict(remote_pod()).patch)["metadata"]["name"]
             for _ in range(20)}
    assert len(names) == 20
    assert all(len(n) == len("train-6d4f9-") + 5 and set(n[-5:]) <= set("bcdfghjklmnpqrstvwxz2456789") for n in names)


@pytest.mark.parametrize("change", [
    {"metadata": {"annotations": {}}},  # not remote
    {"metadata": {"annotations": {"gpupool.io/remote-gpu": "false"}}},
    {"metadata": {"annotations": {"gpupool.io/remote-gpu": "true", "gpupool.io/remote-gpu-inject": "false"}}},
    {"metadata": {"annotations": {"gpupool.io/remote-gpu": "maybe"}}},  # refused by the request's own check
    {"spec": {"containers": [{"name": "main", "image": "x"}]}},  # asks for no GPU
    {"metadata": {"annotations": {"gpupool.io/remote-gpu": "true"}, "generateName": ""}},  # neither name
])
def test_pods_left_alone(change: dict[str, Any]) -> None:
    pod = remote_pod()
    for part, value in change.items():
        pod[part] = {**pod[part], **value}
    assert injection().verdict(pod) == Verdict(True)


def test_an_opt_out_that_is_neither_true_nor_false_is_refused_naming_the_annotation() -> None:
    pod = remote_pod()
    pod["metadata"]["annotations"]["gpupool.io/remote-gpu-inject"] = "no"
    verdict = injection().verdict(pod)
    assert not verdict.allowed and "gpupool.io/remote-gpu-inject" in verdict.reason
    pod["metadata"]["annotations"]["gpupool.io/remote-gpu-inject"] = "true"
    assert injection().verdict(pod).patch


def test_malformed_parts_are_read_as_absent_and_never_crash() -> None:
    specs: list[Any] = [{"containers": "x"}, {"containers": [None, 3]}, {"containers": [{"resources": []}]}, None]
    for spec in specs:
        assert injection().verdict({"metadata": {"generateName": "a-", "annotations": {
            "gpupool.io/remote-gpu": "true"}}, "spec": spec}) == Verdict(True)


def test_the_pod_scheduler_webhook_answers_with_the_steering_and_the_injection_in_one_patch() -> None:
    """Through AdmissionApi: the pod is steered and injected (an extender started with
    --remote-client-image), and without the injection only steered."""
    from gpupool.extender.admission import QuotaAdmission
    from gpupool.extender.cache import ClusterCache
    from gpupool.extender.http.admission_review import AdmissionApi, parse_review, review_response
    from gpupool.extender.http.body import BodyReader
    from gpupool.extender.metrics import ExtenderMetrics
    from gpupool.extender.scheduler_steering import SchedulerSteering

    cache = ClusterCache()
    review = parse_review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
        "namespace": "ml", "userInfo": {"username": "rs-controller"}, "object": remote_pod()}})

    def patch_of(api: AdmissionApi) -> list[dict[str, Any]]:
        response = review_response(review, api.pod_scheduler_verdict(review))["response"]
        assert response["allowed"], response
        return list(json.loads(base64.b64decode(response["patch"])))

    common = (QuotaAdmission(cache, NAMES), ExtenderMetrics(), BodyReader())
    steered_only = patch_of(AdmissionApi(*common, steering=SchedulerSteering(NAMES)))
    both = patch_of(AdmissionApi(*common, steering=SchedulerSteering(NAMES), remote_injection=injection()))
    assert steered_only == [{"op": "add", "path": "/spec/schedulerName", "value": "gpupool-scheduler"}]
    out = apply(remote_pod(), both)
    assert out["spec"]["schedulerName"] == "gpupool-scheduler"
    assert out["metadata"]["name"] == "train-6d4f9-x7k2q"
    assert out["spec"]["initContainers"][0]["name"] == INIT_CONTAINER


def test_with_node_certificates_the_init_container_writes_the_server_name_for_the_client() -> None:
    """The extender signing GPU nodes' own certificates (--remote-gpu-signer) injects
    install-client --check-server-name, so the client checks its server node in the certificate."""
    checked = RemoteInjection(NAMES, IMAGE, suffix=lambda: "x7k2q", check_server_name=True)
    [init] = apply(remote_pod(), checked.verdict(remote_pod()).patch)["spec"]["initContainers"]
    assert init["command"] == ["gpupool", "remote-gpu", "install-client", "--into", LIBRARY_DIR, "--grant", GRANT_DIR,
                               "--check-server-name"]
