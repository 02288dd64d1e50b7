"""The pod-scheduler webhook steers a claim pod only when its claims ask for gpupool's device class
(issue 24, docs/dra.md "Steering claim pods"): read from the claim, or from the template a
per-pod claim will be made from, exactly or among ``firstAvailable`` alternatives; another
driver's claim pod keeps the default scheduler; a claim nobody can read yet steers, with the reason;
malformed claims and pods give a reason, never an exception."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpupool.api.names import ResourceNames
from gpupool.extender.cache import ClusterCache
from gpupool.extender.claim_classes import TemplateClasses, WatchedClaimClasses
from gpupool.extender.dra_watch import apply_claim_event, replace_claims
from gpupool.extender.scheduler_steering import (
    CLAIM,
    FETCH_BUDGET_S,
    GPUPOOL_SCHEDULER,
    TEMPLATE,
    SchedulerSteering,
)
from gpupool.kube.claim_asks import claim_ask, class_request
from tests.extender.test_claim_pods import CLASSES, DRIVER, claim, request

NIC = "nic.example.com"
FPGA = "fpga.example.com"


def template(name: str, *requests: dict[str, Any], namespace: str = "team") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"namespace": namespace, "name": name},
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}


def first_available(name: str, *classes: str) -> dict[str, Any]:
    return {"name": name, "firstAvailable": [{"name": f"alt{i}", "deviceClassName": c} for i, c in enumerate(classes)]}


def claim_pod(*entries: dict[str, Any], namespace: str | None = "team") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p"}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"resourceClaims": list(entries),
                     "containers": [{"name": "main", "resources": {"claims": [{"name": "c"}]}}]}}


def by_claim(name: str, in_pod: str = "c") -> dict[str, Any]:
    return {"name": in_pod, "resourceClaimName": name}


def by_template(name: str, in_pod: str = "c") -> dict[str, Any]:
    return {"name": in_pod, "resourceClaimTemplateName": name}


class Api:
    """What the API holds (``get``'s side), with the reads it was asked for."""

    def __init__(self, *objs: dict[str, Any], error: Exception | None = None) -> None:
        self.objs = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}
        self.error = error
        self.reads: list[tuple[str, str, str, float]] = []

    def get(self, kind: str, namespace: str, name: str, timeout_s: float) -> dict[str, Any] | None:
        self.reads.append((kind, namespace, name, timeout_s))
        if self.error is not None:
            raise self.error
        return self.objs.get((kind, namespace, name))


def steering(claims: list[dict[str, Any]] | None = None, templates: list[dict[str, Any]] | None = None,
             api: Api | None = None, **kw: Any) -> tuple[SchedulerSteering, Api]:
    """The webhook's decision over a cache that watched ``claims`` and ``templates`` (None: that
    watch has not listed yet) and an API holding what ``api`` holds."""
    cache = ClusterCache()
    if claims is not None:
        replace_claims(cache, claims)
    watched = TemplateClasses(cache.claims.classes)
    if templates is not None:
        watched.replace(templates)
    api = api or Api()
    source = WatchedClaimClasses(cache.claims, cache.lock, watched, api.get)
    return SchedulerSteering(ResourceNames(), claims=source, **kw), api


# ------------------------------------------------------------------------------- reading requests
def test_a_request_names_gpupools_class_exactly_or_among_its_alternatives() -> None:
    spec = {"devices": {"requests": [request("nic", device_class=NIC), request("gpu")]}}
    assert class_request(spec, CLASSES) == "gpu"
    assert class_request({"devices": {"requests": [first_available("any", FPGA, DRIVER)]}}, CLASSES) == "any"
    assert class_request({"devices": {"requests": [request("nic", device_class=NIC)]}}, CLASSES) is None


@pytest.mark.parametrize("spec", [None, "x", [], {"devices": "x"}, {"devices": {"requests": "x"}},
                                  {"devices": {"requests": [None, "x", {"exactly": "x"}]}},
                                  {"devices": {"requests": [{"firstAvailable": "x"}]}},
                                  {"devices": {"requests": [{"firstAvailable": [None, 3]}]}}])
def test_a_malformed_spec_names_no_class_and_raises_nothing(spec: Any) -> None:
    assert class_request(spec, CLASSES) is None


def test_a_claims_ask_carries_the_request_naming_gpupools_class_even_when_not_modelled() -> None:
    assert claim_ask(claim("a", request("gpu")), CLASSES).named == "gpu"
    assert claim_ask(claim("b", request("nic", device_class=NIC)), CLASSES).named is None
    modelled_not = claim_ask(claim("c", first_available("any", DRIVER)), CLASSES)
    assert modelled_not.problem is not None and modelled_not.named == "any"


# ------------------------------------------------------------------------------- the decision
def test_a_claim_of_gpupools_class_is_steered_with_the_claim_and_request_named() -> None:
    steer, api = steering([claim("gpu-claim", request("big"))], [])
    decision = steer.decide(claim_pod(by_claim("gpu-claim", "gpu")))
    assert decision.scheduler == GPUPOOL_SCHEDULER
    assert decision.why == "claim 'gpu' (ResourceClaim gpu-claim) asks for gpupool's device class (request 'big')"
    assert api.reads == [], "a watched claim needs no API read"


def test_a_pod_whose_claims_ask_only_for_other_classes_keeps_the_default_scheduler() -> None:
    steer, api = steering([claim("nic", request("nic", device_class=NIC))],
                          [template("fpga", request("fpga", device_class=FPGA))])
    decision = steer.decide(claim_pod(by_claim("nic", "a"), by_template("fpga", "b")))
    assert decision.scheduler is None and decision.why == "its claims ask for no gpupool device class"
    assert steer.verdict(claim_pod(by_claim("nic"))).patch == ()
    assert api.reads == []


def test_one_gpupool_claim_among_other_drivers_claims_steers_the_pod() -> None:
    steer, _ = steering([claim("nic", request("nic", device_class=NIC)), claim("gpu")], [])
    assert steer.decide(claim_pod(by_claim("nic", "a"), by_claim("gpu", "b"))).scheduler == GPUPOOL_SCHEDULER


def test_a_template_is_read_for_the_claim_it_will_make() -> None:
    steer, _ = steering([], [template("gpu-4gi", request("gpu")), template("nic", request("n", device_class=NIC))])
    decision = steer.decide(claim_pod(by_template("gpu-4gi")))
    assert decision.scheduler == GPUPOOL_SCHEDULER and "ResourceClaimTemplate gpu-4gi" in decision.why
    assert steer.decide(claim_pod(by_template("nic"))).scheduler is None


def test_gpupools_class_among_first_available_alternatives_steers() -> None:
    steer, _ = steering([claim("any", first_available("fast", FPGA, DRIVER))],
                        [template("t", first_available("gpu", NIC, DRIVER))])
    assert steer.decide(claim_pod(by_claim("any"))).scheduler == GPUPOOL_SCHEDULER
    assert steer.decide(claim_pod(by_template("t"))).scheduler == GPUPOOL_SCHEDULER
    others, _ = steering([claim("any", first_available("fast", FPGA, NIC))], [])
    assert others.decide(claim_pod(by_claim("any"))).scheduler is None


def test_the_namespace_is_the_admission_requests_when_the_pod_has_none() -> None:
    steer, _ = steering([claim("gpu", namespace="team"), claim("gpu", request("n", device_class=NIC),
                                                               namespace="other")], [])
    assert steer.decide(claim_pod(by_claim("gpu"), namespace=None), "team").scheduler == GPUPOOL_SCHEDULER
    assert steer.decide(claim_pod(by_claim("gpu"), namespace=None), "other").scheduler is None


# ------------------------------------------------------------------------------- not known yet
def test_a_claim_or_template_not_watched_yet_is_read_from_the_api() -> None:
    """A pod created in the same `kubectl apply` as its template: the webhook may run first."""
    api = Api(template("late", request("gpu")), claim("late-nic", request("n", device_class=NIC)))
    steer, _ = steering([], [], api)
    assert steer.decide(claim_pod(by_template("late"))).scheduler == GPUPOOL_SCHEDULER
    assert steer.decide(claim_pod(by_claim("late-nic"))).scheduler is None
    assert [(kind, name) for kind, _, name, _ in api.reads] == [(TEMPLATE, "late"), (CLAIM, "late-nic")]
    assert all(0 < timeout <= FETCH_BUDGET_S for *_, timeout in api.reads)


def test_watches_not_listed_yet_are_read_through_the_api() -> None:
    api = Api(claim("gpu"), template("nic", request("n", device_class=NIC)))
    steer, _ = steering(None, None, api)
    assert steer.decide(claim_pod(by_claim("gpu"))).scheduler == GPUPOOL_SCHEDULER
    assert steer.decide(claim_pod(by_template("nic"))).scheduler is None


def test_a_claim_the_api_has_not_either_steers_with_the_reason() -> None:
    """Documented (docs/dra.md "Steering claim pods"): unknown means steered, as before issue 24,
    since gpupool's scheduler places a pod gpupool has nothing to do with as the default one would."""
    steer, _ = steering([claim("nic", request("n", device_class=NIC))], [])
    decision = steer.decide(claim_pod(by_claim("nic", "a"), by_claim("missing", "b")))
    assert decision.scheduler == GPUPOOL_SCHEDULER
    assert decision.why.startswith("claim 'b' (ResourceClaim missing) is not known (not found): steered")


def test_the_reason_is_in_the_debug_log(caplog: pytest.LogCaptureFixture) -> None:
    steer, _ = steering([], [])
    with caplog.at_level(logging.DEBUG, logger="gpupool.extender.scheduler_steering"):
        steer.verdict(claim_pod(by_template("missing")))
    assert "pod-scheduler: pod team/p: gpupool-scheduler (claim 'c' (ResourceClaimTemplate missing) is not known " \
           "(not found)" in caplog.text


def test_an_api_failure_steers_with_the_reason_and_no_exception() -> None:
    steer, _ = steering([], [], Api(error=TimeoutError("read timed out")))
    decision = steer.decide(claim_pod(by_template("t")))
    assert decision.scheduler == GPUPOOL_SCHEDULER and "(cannot be read: TimeoutError)" in decision.why


def test_api_reads_stop_at_the_budget() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    class SlowApi(Api):
        def get(self, kind: str, namespace: str, name: str, timeout_s: float) -> dict[str, Any] | None:
            now[0] += FETCH_BUDGET_S  # each read takes the whole budget
            return super().get(kind, namespace, name, timeout_s)

    api = SlowApi(claim("a", request("n", device_class=NIC)), claim("b"))
    steer, _ = steering([], [], api, clock=clock)
    decision = steer.decide(claim_pod(by_claim("a", "first"), by_claim("b", "second")))
    assert [name for _, _, name, _ in api.reads] == ["a"], "no read once the budget is spent"
    assert decision.scheduler == GPUPOOL_SCHEDULER and f"not read within {FETCH_BUDGET_S:g} s" in decision.why


def test_the_watch_follows_claims_and_templates_as_they_change() -> None:
    cache = ClusterCache()
    replace_claims(cache, [])
    templates = TemplateClasses(cache.claims.classes)
    templates.replace([])
    api = Api()
    steer = SchedulerSteering(ResourceNames(), claims=WatchedClaimClasses(cache.claims, cache.lock, templates,
                                                                           api.get))
    apply_claim_event(cache, "ADDED", claim("c", request("n", device_class=NIC)))
    templates.apply("ADDED", template("t", request("gpu")))
    assert steer.decide(claim_pod(by_claim("c"))).scheduler is None
    assert steer.decide(claim_pod(by_template("t"))).scheduler == GPUPOOL_SCHEDULER
    apply_claim_event(cache, "MODIFIED", claim("c", request("gpu")))
    templates.apply("MODIFIED", template("t", request("n", device_class=NIC)))
    assert steer.decide(claim_pod(by_claim("c"))).scheduler == GPUPOOL_SCHEDULER
    assert steer.decide(claim_pod(by_template("t"))).scheduler is None
    assert api.reads == []
    templates.apply("DELETED", template("t"))
    steer.decide(claim_pod(by_template("t")))
    assert [name for _, _, name, _ in api.reads] == ["t"], "a deleted template is not known any more"


# ------------------------------------------------------------------------------- malformed
@pytest.mark.parametrize("entries", [
    [None], ["x"], [{"name": "c"}], [{"name": "c", "resourceClaimName": 3}],
    [{"resourceClaimName": "gpu"}], [{"name": "c", "resourceClaimName": "", "resourceClaimTemplateName": ""}],
])
def test_entries_naming_no_claim_or_template_leave_the_pod_with_the_reason(entries: list[Any]) -> None:
    steer, api = steering([claim("gpu")], [])
    decision = steer.decide(claim_pod(*entries))
    assert decision.scheduler is None and decision.why == "its resourceClaims name no claim or template"
    assert api.reads == []


@pytest.mark.parametrize("spec", [None, "x", {"devices": {"requests": [None, {"exactly": "x"}]}}])
def test_a_malformed_claim_or_template_asks_for_nothing_and_raises_nothing(spec: Any) -> None:
    bad_claim = claim("bad") | {"spec": spec}
    bad_template = template("bad") | {"spec": {"spec": spec}}
    steer, _ = steering([bad_claim], [bad_template, template("worse") | {"spec": "x"}])
    for entry in (by_claim("bad"), by_template("bad"), by_template("worse")):
        decision = steer.decide(claim_pod(entry))
        assert decision.scheduler is None and decision.why == "its claims ask for no gpupool device class"
    fetched, _ = steering([], [], Api(bad_claim, bad_template))
    assert fetched.decide(claim_pod(by_claim("bad"), by_template("bad"))).scheduler is None


def test_malformed_watch_events_are_ignored_or_read_as_asking_nothing() -> None:
    templates = TemplateClasses(CLASSES)
    templates.replace([template("t", request("gpu")), "x", {"metadata": "x"}])  # type: ignore[list-item]
    templates.apply("ADDED", "x")  # type: ignore[arg-type]
    assert templates.cached("team", "t").request == "gpu"


# ------------------------------------------------------------------ admins' DeviceClasses of gpupool's driver
def classes_steering(classes: list[dict[str, Any]] | None, claims: list[dict[str, Any]],
                     templates: list[dict[str, Any]], api: Api | None = None) -> tuple[SchedulerSteering, Any]:
    """:func:`steering` with the DeviceClass watch (None: it has not listed yet)."""
    from gpupool.extender.gpupool_classes import GpupoolClasses

    cache = ClusterCache()
    replace_claims(cache, claims)
    watched = TemplateClasses(cache.claims.classes)
    watched.replace(templates)
    classes_watch = GpupoolClasses(cache.claims, cache.lock, watched)
    cache.claims.classes_synced = False
    if classes is not None:
        classes_watch.replace(classes)
    source = WatchedClaimClasses(cache.claims, cache.lock, watched, (api or Api()).get)
    return SchedulerSteering(ResourceNames(), claims=source), classes_watch


def device_class(name: str, expression: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}


A100_SHARE = device_class("a100-share", f'device.driver == "{DRIVER}" && '
                                        f'device.attributes["{DRIVER}"].model.startsWith("NVIDIA-A100")')


def test_a_claim_or_template_of_an_admins_class_for_gpupools_driver_steers() -> None:
    steer, watch = classes_steering([A100_SHARE, device_class(NIC, f'device.driver == "{NIC}"')],
                                    [claim("mine", request("gpu", device_class="a100-share")),
                                     claim("nic", request("n", device_class=NIC))],
                                    [template("t", request("gpu", device_class="a100-share"))])
    assert steer.decide(claim_pod(by_claim("mine"))).scheduler == GPUPOOL_SCHEDULER
    assert steer.decide(claim_pod(by_template("t"))).scheduler == GPUPOOL_SCHEDULER
    assert steer.decide(claim_pod(by_claim("nic"))).scheduler is None
    watch.apply("DELETED", A100_SHARE)  # no longer gpupool's: the claim and the template are read again
    assert steer.decide(claim_pod(by_claim("mine"))).scheduler is None
    assert steer.decide(claim_pod(by_template("t"))).scheduler is None


def test_before_device_classes_are_listed_a_claim_of_an_unknown_class_steers() -> None:
    """The claim may be of an admin's class for gpupool's driver: steering another driver's pod costs
    only the scheduler's name, leaving a gpupool claim pod to the default scheduler loses the node choice."""
    mine = claim("mine", request("gpu", device_class="a100-share"))
    steer, _ = classes_steering(None, [mine], [], Api(mine))  # the watch holds it, the API is asked again
    decision = steer.decide(claim_pod(by_claim("mine")))
    assert decision.scheduler == GPUPOOL_SCHEDULER and "device classes not listed yet" in decision.why
    api = Api(mine)
    steer, _ = classes_steering([A100_SHARE], [mine], [], api)
    assert "asks for gpupool's device class" in steer.decide(claim_pod(by_claim("mine"))).why
    assert api.reads == []  # listed: the watch answers
