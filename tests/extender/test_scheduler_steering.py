"""The pod-scheduler webhook's decision (gpupool/extender/scheduler_steering.py): which new pods get
``spec.schedulerName: gpupool-scheduler``, by container kind, requests or limits, the pod's own
schedulerName, the opt-out annotation, the aliases the extender serves, and pods too malformed to
read (left alone, never a crash)."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.names import ALIASES, NVIDIA_GPU, ResourceNames
from gpupool.extender.scheduler_steering import (
    DEFAULT_SCHEDULER,
    GPUPOOL_SCHEDULER,
    ClaimReading,
    SchedulerSteering,
    opt_out_key,
)

NAMES = ResourceNames()
STEER = SchedulerSteering(NAMES)
PATCH = ({"op": "add", "path": "/spec/schedulerName", "value": GPUPOOL_SCHEDULER},)


def pod(*, containers: list[dict[str, Any]] | None = None, init: list[dict[str, Any]] | None = None,
        scheduler: str | None = DEFAULT_SCHEDULER, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers if containers is not None else [{"name": "main"}]}
    if init is not None:
        spec["initContainers"] = init
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def asking(resource: str, where: str = "limits", quantity: str = "1") -> dict[str, Any]:
    return {"name": "c", "image": "busybox", "resources": {where: {"cpu": "1", resource: quantity}}}


@pytest.mark.parametrize("where", ["limits", "requests"])
@pytest.mark.parametrize("resource", [NAMES.gpu, NAMES.gpu_mem, NAMES.gpu_core, NAMES.gpu_shared])
def test_an_app_container_asking_for_gpupools_resources_is_steered(resource: str, where: str) -> None:
    decision = STEER.decide(pod(containers=[{"name": "side"}, asking(resource, where)]))
    assert decision.scheduler == GPUPOOL_SCHEDULER and decision.why == f"asks for {resource}"
    assert STEER.verdict(pod(containers=[asking(resource, where)])).patch == PATCH


@pytest.mark.parametrize("resource", ALIASES)
def test_the_aliases_the_extender_serves_are_steered(resource: str) -> None:
    assert STEER.decide(pod(containers=[asking(resource)])).scheduler == GPUPOOL_SCHEDULER


def test_nvidia_gpu_alone_is_steered_only_where_the_extender_reads_it_as_hamis() -> None:
    whole_cards = pod(containers=[asking(NVIDIA_GPU)])
    assert STEER.decide(whole_cards).scheduler is None  # NVIDIA's own device plugin's pods stay put
    assert SchedulerSteering(ResourceNames(hami=True)).decide(whole_cards).scheduler == GPUPOOL_SCHEDULER


def test_init_and_sidecar_containers_count() -> None:
    init = asking(NAMES.gpu_mem, "requests")
    sidecar = asking(NAMES.gpu_core) | {"restartPolicy": "Always"}
    assert STEER.decide(pod(init=[init])).scheduler == GPUPOOL_SCHEDULER
    assert STEER.decide(pod(init=[{"name": "setup"}, sidecar])).scheduler == GPUPOOL_SCHEDULER


def test_the_name_counts_whatever_the_quantity() -> None:
    """kube-scheduler sends a pod to the extender when the name appears (managedResources)."""
    assert STEER.decide(pod(containers=[asking(NAMES.gpu_mem, quantity="0")])).scheduler == GPUPOOL_SCHEDULER


@pytest.mark.parametrize("scheduler", [None, "", DEFAULT_SCHEDULER])
def test_no_scheduler_or_the_default_one_is_replaced(scheduler: str | None) -> None:
    assert STEER.verdict(pod(containers=[asking(NAMES.gpu_mem)], scheduler=scheduler)).patch == PATCH


def test_a_pod_naming_another_scheduler_is_left_alone() -> None:
    decision = STEER.decide(pod(containers=[asking(NAMES.gpu_mem)], scheduler="volcano"))
    assert decision.scheduler is None and decision.why == "names scheduler 'volcano'"
    assert STEER.verdict(pod(containers=[asking(NAMES.gpu_mem)], scheduler="volcano")).patch == ()


def test_a_pod_already_on_gpupools_scheduler_needs_no_patch() -> None:
    assert STEER.verdict(pod(containers=[asking(NAMES.gpu_mem)], scheduler=GPUPOOL_SCHEDULER)).patch == ()


def test_a_cpu_pod_is_left_alone() -> None:
    cpu = pod(containers=[{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                                                      "limits": {"example.com/foo": "1"}}}])
    decision = STEER.decide(cpu)
    assert decision.scheduler is None and decision.why == "asks for no resource gpupool manages"
    assert STEER.verdict(cpu).allowed and STEER.verdict(cpu).patch == ()


def test_the_opt_out_annotation_keeps_the_default_scheduler() -> None:
    key = opt_out_key(NAMES.domain)
    assert key == "gpupool.io/scheduler"
    opted_out = pod(containers=[asking(NAMES.gpu_mem)], annotations={key: "default"})
    assert STEER.decide(opted_out).scheduler is None
    assert STEER.decide(opted_out).why == "annotation gpupool.io/scheduler=default"
    # any other value is no opt-out
    assert STEER.decide(pod(containers=[asking(NAMES.gpu_mem)], annotations={key: "yes"})).scheduler \
        == GPUPOOL_SCHEDULER


def test_the_domain_and_the_scheduler_name_are_the_deployments() -> None:
    steer = SchedulerSteering(ResourceNames("example.com"), "gpus-first")
    ours = pod(containers=[asking("example.com/gpu-mem")])
    assert steer.verdict(ours).patch == ({"op": "add", "path": "/spec/schedulerName", "value": "gpus-first"},)
    assert steer.decide(pod(containers=[asking(NAMES.gpu_mem)])).scheduler is None  # not this domain's
    assert steer.decide(ours | {"metadata": {"annotations": {"example.com/scheduler": "default"}}}).scheduler is None


@pytest.mark.parametrize("name", ["", DEFAULT_SCHEDULER])
def test_steering_to_the_default_scheduler_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="gpupool's own"):
        SchedulerSteering(NAMES, name)


@pytest.mark.parametrize(("malformed", "steered"), [
    pytest.param({}, False, id="empty"),
    pytest.param({"spec": None, "metadata": None}, False, id="nulls"),
    pytest.param({"spec": "x", "metadata": "y"}, False, id="strings"),
    pytest.param({"spec": {"containers": 1}}, False, id="containers-not-a-list"),
    pytest.param({"spec": {"containers": [None, 3, "c"]}}, False, id="containers-not-objects"),
    pytest.param({"spec": {"containers": [{"resources": []}]}}, False, id="resources-a-list"),
    pytest.param({"spec": {"containers": [{"resources": {"limits": ["gpupool.io/gpu-mem"]}}]}}, False,
                 id="limits-a-list"),
    pytest.param({"spec": {"schedulerName": 7, "containers": [asking("gpupool.io/gpu-mem")]}}, False,
                 id="scheduler-a-number"),
    pytest.param({"metadata": {"annotations": ["gpupool.io/scheduler"]},
                  "spec": {"containers": [{"resources": {"limits": {"gpupool.io/gpu-mem": None}}}]}}, True,
                 id="annotations-a-list-and-a-null-quantity"),
])
def test_a_malformed_pod_gets_a_decision_never_an_exception(malformed: dict[str, Any], steered: bool) -> None:
    """The apiserver validates a pod after the mutating webhooks: whatever is unreadable asks for
    nothing, what is readable is judged."""
    verdict = STEER.verdict(malformed)
    assert verdict.allowed and verdict.patch == (PATCH if steered else ())


def claiming(claims: Any, **kw: Any) -> dict[str, Any]:
    obj = pod(containers=[{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}], **kw)
    obj["spec"]["resourceClaims"] = claims
    return obj


CLAIMS = [{"name": "gpu", "resourceClaimTemplateName": "gpu-4gi"}]


class EveryClaimAsksForGpupool:
    """A claim source for which every claim and template asks for gpupool's class (what each one
    asks is tests/extender/test_claim_steering.py's subject)."""

    def cached(self, namespace: str, kind: str, name: str) -> ClaimReading:
        return ClaimReading("gpu")

    def fetch(self, namespace: str, kind: str, name: str, timeout_s: float) -> ClaimReading:
        raise AssertionError("a cached claim is not read again")


def test_a_claim_pod_is_steered_only_when_claim_steering_is_on() -> None:
    """docs/dra.md, "Steering claim pods": gpupool chooses the node of claim pods only on its own
    scheduler, so the webhook sends them there when asked to."""
    steer = SchedulerSteering(NAMES, claims=EveryClaimAsksForGpupool())
    decision = steer.decide(claiming(CLAIMS))
    assert decision.scheduler == GPUPOOL_SCHEDULER
    assert decision.why == "claim 'gpu' (ResourceClaimTemplate gpu-4gi) asks for gpupool's device class (request 'gpu')"
    assert steer.verdict(claiming(CLAIMS)).patch == PATCH
    assert STEER.decide(claiming(CLAIMS)).scheduler is None  # off by default: the DRA path as it was


@pytest.mark.parametrize("claims", [[], None, "x", {"name": "gpu"}])
def test_no_claims_or_a_malformed_list_is_not_a_claim_pod(claims: Any) -> None:
    assert SchedulerSteering(NAMES, claims=EveryClaimAsksForGpupool()).decide(claiming(claims)).scheduler is None


def test_a_claim_pod_keeps_the_opt_out_and_another_scheduler() -> None:
    steer = SchedulerSteering(NAMES, claims=EveryClaimAsksForGpupool())
    key = opt_out_key(NAMES.domain)
    assert steer.decide(claiming(CLAIMS, annotations={key: "default"})).scheduler is None
    assert steer.decide(claiming(CLAIMS, scheduler="their-scheduler")).scheduler is None
