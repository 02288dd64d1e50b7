"""``gpupool certs bootstrap --webhook``: the CA written into named webhook configurations, waited
for when not there yet, never over a concurrent change, and nothing else touched."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupool.extender.http.webhook_ca import (
    InjectResult,
    WebhookConfigurations,
    WebhookTarget,
    WebhookTargetError,
    inject_ca,
)

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
BUNDLE = base64.b64encode(CA).decode()


def configuration(kind: str, name: str, entries: int = 1, version: str = "1") -> Any:
    hooks = [{"name": f"h{i}.gpupool.io", "clientConfig": {"service": {"name": "gpupool-extender",
                                                                       "namespace": "gpupool-system"}},
              "admissionReviewVersions": ["v1"], "sideEffects": "None"} for i in range(entries)]
    model = client.V1MutatingWebhook if kind == "mutating" else client.V1ValidatingWebhook
    whole = client.V1MutatingWebhookConfiguration if kind == "mutating" else client.V1ValidatingWebhookConfiguration
    return whole(metadata=client.V1ObjectMeta(name=name, resource_version=version),
                 webhooks=[model(name=h["name"], client_config=client.AdmissionregistrationV1WebhookClientConfig(
                     service=client.AdmissionregistrationV1ServiceReference(name="gpupool-extender",
                                                                             namespace="gpupool-system")),
                                 admission_review_versions=["v1"], side_effects="None") for h in hooks])


class FakeAdmission:
    """Both kinds with the apiserver's 404 and optimistic-concurrency 409."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], Any] = {}
        self.writes: list[tuple[str, str]] = []
        self.appear_after_reads: dict[tuple[str, str], tuple[int, Any]] = {}
        self.race_once: set[tuple[str, str]] = set()

    def _read(self, kind: str, name: str) -> Any:
        key = (kind, name)
        if key in self.appear_after_reads:
            left, obj = self.appear_after_reads[key]
            if left <= 0:
                self.stored[key] = obj
                del self.appear_after_reads[key]
            else:
                self.appear_after_reads[key] = (left - 1, obj)
        if key not in self.stored:
            raise ApiException(status=404, reason="NotFound")
        return copy.deepcopy(self.stored[key])

    def _replace(self, kind: str, name: str, body: Any) -> None:
        key = (kind, name)
        if key in self.race_once:  # someone else wrote it between our read and our write
            self.race_once.discard(key)
            current = self.stored[key]
            current.metadata.resource_version = str(int(current.metadata.resource_version) + 1)
        if body.metadata.resource_version != self.stored[key].metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        body = copy.deepcopy(body)
        body.metadata.resource_version = str(int(body.metadata.resource_version) + 1)
        self.stored[key] = body
        self.writes.append(key)

    def read_mutating_webhook_configuration(self, name: str) -> Any:
        return self._read("mutating", name)

    def read_validating_webhook_configuration(self, name: str) -> Any:
        return self._read("validating", name)

    def replace_mutating_webhook_configuration(self, name: str, body: Any) -> None:
        self._replace("mutating", name, body)

    def replace_validating_webhook_configuration(self, name: str, body: Any) -> None:
        self._replace("validating", name, body)

    def bundles(self, kind: str, name: str) -> list[str | None]:
        return [w.client_config.ca_bundle for w in self.stored[(kind, name)].webhooks]


SCHEDULER = WebhookTarget("mutating", "gpupool-scheduler")
QUOTA = WebhookTarget("validating", "gpupool-quota")


def run(api: FakeAdmission, targets: list[WebhookTarget], wait_s: float = 5.0) -> InjectResult:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s
    return inject_ca(WebhookConfigurations(api), CA, targets, wait_s=wait_s, clock=lambda: now[0], sleep=sleep)


def test_every_entry_of_each_named_configuration_gets_the_ca_once() -> None:
    api = FakeAdmission()
    api.stored[("mutating", "gpupool-scheduler")] = configuration("mutating", "gpupool-scheduler")
    api.stored[("validating", "gpupool-quota")] = configuration("validating", "gpupool-quota", entries=3)
    api.stored[("validating", "someone-else")] = configuration("validating", "someone-else")
    result = run(api, [SCHEDULER, QUOTA])
    assert result.written == [SCHEDULER, QUOTA] and not result.current and not result.missing
    assert api.bundles("mutating", "gpupool-scheduler") == [BUNDLE]
    assert api.bundles("validating", "gpupool-quota") == [BUNDLE] * 3
    assert api.bundles("validating", "someone-else") == [None]  # only what was named
    again = run(api, [SCHEDULER, QUOTA])
    assert again.current == [SCHEDULER, QUOTA] and len(api.writes) == 2  # nothing written the second time


def test_a_configuration_not_there_yet_is_waited_for_and_an_absent_one_reported() -> None:
    api = FakeAdmission()
    api.appear_after_reads[("mutating", "gpupool-scheduler")] = (2, configuration("mutating", "gpupool-scheduler"))
    result = run(api, [SCHEDULER, QUOTA], wait_s=5.0)
    assert result.written == [SCHEDULER] and result.missing == [QUOTA]
    assert api.bundles("mutating", "gpupool-scheduler") == [BUNDLE]


def test_a_concurrent_change_is_read_again_not_overwritten() -> None:
    api = FakeAdmission()
    api.stored[("mutating", "gpupool-scheduler")] = configuration("mutating", "gpupool-scheduler")
    api.race_once.add(("mutating", "gpupool-scheduler"))
    assert run(api, [SCHEDULER]).written == [SCHEDULER]
    assert api.bundles("mutating", "gpupool-scheduler") == [BUNDLE]


def test_an_api_error_other_than_not_found_is_raised() -> None:
    class Forbidden(FakeAdmission):
        def read_mutating_webhook_configuration(self, name: str) -> Any:
            raise ApiException(status=403, reason="Forbidden")
    with pytest.raises(ApiException):
        run(Forbidden(), [SCHEDULER])


@pytest.mark.parametrize("text", ["gpupool-scheduler", "mutatingx/a", "mutating/", "validating/a/b", "/a"])
def test_a_malformed_target_names_the_expected_form(text: str) -> None:
    with pytest.raises(WebhookTargetError, match="mutating/NAME or validating/NAME"):
        WebhookTarget.parse(text)
    assert WebhookTarget.parse("validating/gpupool-quota") == QUOTA
