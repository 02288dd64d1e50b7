"""Shared pieces of the DRA end-to-end tests: the shipped DeviceClass, claims, pods using them, the
agent's files (CDI specs, checkpoint) and the node's ResourceSlice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.testenv.kubelet import Kubelet

DRIVER = "gpu.gpupool.io"
DEVICE_CLASSES = Path(__file__).parents[2] / "deploy/kustomize/components/dra/device-classes.yaml"


def containerd_dra_args(kubelet: Kubelet) -> tuple[str, ...]:
    """The node agent's DRA flags on a containerd kubelet: kubelet's directory, and CDI specs where
    containerd reads them."""
    assert kubelet.runtime.containerd is not None, "a kubelet with containerd"
    return ("--dra", "--dra-kubelet-dir", str(kubelet.root_dir),
            "--cdi-dir", str(kubelet.runtime.containerd.layout.cdi_spec_dir))


def claim_manifest(name: str, memory: str) -> dict[str, Any]:
    """A ResourceClaim for ``memory`` of one gpupool card."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory}}}}]}}}


def claim_pod(name: str, claim: str, node: str, image: str = "busybox",
              command: tuple[str, ...] = ("sleep", "3600")) -> dict[str, Any]:
    """A pod on ``node`` whose one container uses ``claim``; an image other than the fake runtime's
    ``busybox`` is a local one of a containerd node (never pulled)."""
    container: dict[str, Any] = {"name": "main", "image": image, "command": list(command),
                                 "resources": {"claims": [{"name": "gpu"}]}}
    if image != "busybox":
        container["imagePullPolicy"] = "Never"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}], "containers": [container]}}


def cdi_env(cdi_dir: Path, uid: str) -> dict[str, str] | None:
    """The env of a claim's CDI device, or ``None`` while its spec file is missing."""
    path = cdi_dir / f"gpupool.io-claim_{uid}.json"
    if not path.is_file():
        return None
    (device,) = json.loads(path.read_text())["devices"]
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


def checkpoint_uids(path: Path) -> set[str]:
    """The claim UIDs in the agent's checkpoint."""
    return {c["claim"]["uid"] for c in json.loads(path.read_text())["claims"]} if path.is_file() else set()


def node_slice(api: client.ApiClient, node: str) -> dict[str, Any] | None:
    """The node's ResourceSlice as JSON, or ``None``."""
    for item in client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={node}").items:
        return api.sanitize_for_serialization(item)  # type: ignore[no-any-return]
    return None


@contextmanager
def dra_installed(api: client.ApiClient, node: str) -> Iterator[client.ResourceV1Api]:
    """The shipped DeviceClass for the test; it and the node's slices deleted afterwards."""
    resource = client.ResourceV1Api(api)
    try:
        resource.create_device_class(yaml.safe_load(DEVICE_CLASSES.read_text()))
    except ApiException as exc:
        if exc.status != 409:  # an earlier run's, identical
            raise
    try:
        yield resource
    finally:
        resource.delete_device_class(DRIVER)
        for item in resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items:
            resource.delete_resource_slice(item.metadata.name)
