"""The PodResources client reads each pod's entry of a List once: the agent lists on every
Allocate, GetPreferredAllocation and PreStartContainer, and almost every pod is the same between two
Lists (reading them all again cost ~25 ms per List on a node of 200 pods)."""

from __future__ import annotations

import asyncio

from gpupool.nodeagent.deviceplugin.api import podres_pb
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.types import PodResourcesSnapshot

MEM = "gpupool.io/gpu-mem"


def entry(name: str, **containers: list[str]) -> podres_pb.PodResources:
    """A pod as kubelet lists it: one ContainerDevices per device ID."""
    return podres_pb.PodResources(name=name, namespace="default", containers=[
        podres_pb.ContainerResources(name=c, devices=[podres_pb.ContainerDevices(resource_name=MEM, device_ids=[i])
                                                      for i in ids])
        for c, ids in containers.items()])


def lists(*replies: list[podres_pb.PodResources]) -> list[PodResourcesSnapshot]:
    """What the client makes of each reply in turn (the replies stand in for kubelet's)."""
    client = PodResourcesClient("/nonexistent/podres.sock")
    answers = iter(replies)

    async def reply(request: podres_pb.ListPodResourcesRequest) -> podres_pb.ListPodResourcesResponse:
        return podres_pb.ListPodResourcesResponse(pod_resources=next(answers))

    client._list_once = reply  # type: ignore[method-assign]

    async def main() -> list[PodResourcesSnapshot]:
        return [await client.list() for _ in replies]
    return asyncio.run(main())


def test_an_unchanged_pod_is_read_once_and_a_changed_one_again() -> None:
    a, b = entry("a", main=["g0-m0", "g0-m1"]), entry("b", main=["g1-m0"])
    b_grew = entry("b", main=["g1-m0"], side=["g1-m1"])
    first, second, third = lists([a, b], [a, b], [a, b_grew])
    assert first == second == {("default", "a"): {"main": {MEM: frozenset({"g0-m0", "g0-m1"})}},
                               ("default", "b"): {"main": {MEM: frozenset({"g1-m0"})}}}
    assert second[("default", "a")] is first[("default", "a")]  # found by its bytes, not read again
    assert third[("default", "a")] is first[("default", "a")]
    assert third[("default", "b")] == {"main": {MEM: frozenset({"g1-m0"})}, "side": {MEM: frozenset({"g1-m1"})}}


def test_a_pod_that_left_is_forgotten_and_read_afresh_when_it_comes_back() -> None:
    a, b = entry("a", main=["g0-m0"]), entry("b", main=["g1-m0"])
    first, second, third = lists([a, b], [b], [a, b])
    assert ("default", "a") not in second
    assert third[("default", "a")] == first[("default", "a")]
    assert third[("default", "a")] is not first[("default", "a")]  # only the last List's pods are kept


def test_a_pod_listed_twice_joins_its_containers() -> None:
    [snapshot] = lists([entry("a", main=["g0-m0"]), entry("a", side=["g0-m1"], main=["g0-m2"])])
    assert snapshot == {("default", "a"): {"main": {MEM: frozenset({"g0-m2"})}, "side": {MEM: frozenset({"g0-m1"})}}}


def test_the_device_ids_of_a_resource_are_joined_across_entries() -> None:
    """kubelet sends one ContainerDevices per device ID (and per NUMA node): every ID counts."""
    pod = podres_pb.PodResources(name="a", namespace="default", containers=[podres_pb.ContainerResources(
        name="main", devices=[podres_pb.ContainerDevices(resource_name=MEM, device_ids=["g0-m0"]),
                              podres_pb.ContainerDevices(resource_name="other", device_ids=["x"]),
                              podres_pb.ContainerDevices(resource_name=MEM, device_ids=["g0-m1", "g0-m2"])])])
    [snapshot] = lists([pod])
    assert snapshot == {("default", "a"): {"main": {MEM: frozenset({"g0-m0", "g0-m1", "g0-m2"}),
                                                    "other": frozenset({"x"})}}}
