"""A pod replaced under its name between the bind's decision and its Binding, on v1.20-v1.22.

Those apiservers apply a Binding to whichever pod has its name (``BindingREST.Create`` ->
``assignPod`` -> ``setPodHostAndAnnotations``, no uid or resourceVersion precondition), so the
replacement is bound with the assignment decided for its predecessor. The assignment names the
predecessor's uid (``podUID``), and from there nobody takes it for the replacement's: the cache
books none of its cards and keeps GPU pods off the node until the pod ends, a repeated bind of the
replacement answers an error instead of adopting it, and the pod gets an Event saying why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.api.annotations import decode_assignment
from gpupool.extender.binder import Binder
from gpupool.extender.bookings import UNREADABLE
from gpupool.extender.cache import ClusterCache
from gpupool.testing.fake_api import FakePodApi
from tests.extender.binder_world import ASSIGNMENT, free_mib, world
from tests.kube.builders import container, node, pod

CARD_MIB = 16276
REPLACEMENT_UID = "uid-of-the-replacement"


class ReplacedBeforeBinding:
    """A :class:`FakePodApi` that binds as v1.20-v1.22 do (by name alone: the uid and
    resourceVersion of the Binding are ignored) and, on the first Binding, first deletes the pod
    and creates ``replacement`` under its name: the window between the bind's read and its write."""

    def __init__(self, api: FakePodApi, replacement: dict[str, Any]) -> None:
        self.api = api
        self.replacement: dict[str, Any] | None = replacement

    def __getattr__(self, verb: str) -> Any:
        return getattr(self.api, verb)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, *,
                 annotations: Mapping[str, str] | None = None, resource_version: str = "") -> None:
        if self.replacement is not None:
            self.api.delete_pod(namespace, name)
            self.api.create_pod(self.replacement)
            self.replacement = None
        self.api.bind_pod(namespace, name, "", node, annotations=annotations)


def replaced_during_bind() -> tuple[FakePodApi, ClusterCache, str]:
    """Pod p (4000 MiB) bound on a v1.20 apiserver while a pod asking 12000 MiB replaces it;
    returns the API, the cache and the uid the bind was for."""
    api, cache, _ = world([node("n1", [CARD_MIB])])
    old = api.create_pod(pod("p", container(mib=4000)))
    replacement = pod("p", container(mib=12000), uid=REPLACEMENT_UID)
    result = Binder(cache, ReplacedBeforeBinding(api, replacement)).bind(  # type: ignore[arg-type]
        "default", "p", old["metadata"]["uid"], "n1")
    assert result.ok, result  # the Binding succeeded: a v1.20 apiserver cannot tell the binder otherwise
    return api, cache, old["metadata"]["uid"]


def test_the_replacement_is_bound_with_an_assignment_that_names_its_predecessor() -> None:
    api, _, old_uid = replaced_during_bind()
    bound = api.get_pod("default", "p")
    assert bound["metadata"]["uid"] == REPLACEMENT_UID and bound["spec"]["nodeName"] == "n1"
    assert decode_assignment(bound["metadata"]["annotations"][ASSIGNMENT]).pod_uid == old_uid


def test_the_cache_books_none_of_its_cards_and_keeps_gpu_pods_off_the_node_until_it_ends() -> None:
    api, cache, old_uid = replaced_during_bind()
    assert free_mib(cache, "n1") == [CARD_MIB]  # neither the predecessor's 4000 MiB nor a pin
    assert cache.unreadable_on("n1") == {"default/p"}
    refusal = cache.claim_problems["n1"]
    assert f"decided for pod uid {old_uid}, not this pod (uid {REPLACEMENT_UID})" in refusal
    newcomer = api.create_pod(pod("q", container(mib=1000)))
    refused = Binder(cache, api).bind("default", "q", newcomer["metadata"]["uid"], "n1")
    assert "decided for pod uid" in refused.error, refused
    [notice] = [n for n in cache.take_notices() if n.reason == UNREADABLE]
    assert (notice.pod_key, notice.uid) == ("default/p", REPLACEMENT_UID)
    assert f"decided for pod uid {old_uid}" in notice.message

    api.set_pod_phase("default", "p", "Failed")  # the node agent refused its Allocate: kubelet fails it
    assert not cache.claim_problems
    assert Binder(cache, api).bind("default", "q", newcomer["metadata"]["uid"], "n1").ok


def test_a_repeated_bind_of_the_replacement_does_not_adopt_its_predecessors_assignment() -> None:
    """Before ``podUID``, a bind finding the pod bound where asked was a success adopting the
    assignment on it; the predecessor's is not the replacement's."""
    api, cache, old_uid = replaced_during_bind()
    result = Binder(cache, api).bind("default", "p", REPLACEMENT_UID, "n1")
    assert f"decided for pod uid {old_uid}, not this pod (uid {REPLACEMENT_UID})" in result.error, result
