"""The helm e2e tests' shared parts: a release driven by a real helm binary (Helm 4 or Helm 3) against
the test control plane, and the clean-up that leaves the cluster as the module found it (the release
uninstalled, cluster-scoped objects of its manifests and gpupool's namespaces deleted, and the CRDs
Helm installed, which it never deletes, removed so that later modules install their own)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.conftest import delete_namespace
from tests.e2e.e2e_support import wait_crds_gone

RELEASE = "gpupool"
SYSTEM = "gpupool-system"
NAMESPACES = ("gpupool-system", "gpupool-node", "gpupool-node-lease")
CRDS = ("gpuquotas.gpupool.io", "resourcegroups.gpupool.io")
COMMAND_TIMEOUT_S = 180


@dataclass
class Release:
    """The helm binary and cluster of this module, and what the tests learnt on the way."""

    binary: Path
    plane: ControlPlane
    home: Path
    manifests: list[str] = field(default_factory=list)

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        """helm with the control plane's kubeconfig and its own cache/config/data directories."""
        env = {**os.environ, "KUBECONFIG": str(self.plane.kubeconfig),
               "HELM_CACHE_HOME": str(self.home / "cache"), "HELM_CONFIG_HOME": str(self.home / "config"),
               "HELM_DATA_HOME": str(self.home / "data")}
        return subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=env,
                              timeout=COMMAND_TIMEOUT_S, check=False)

    def ok(self, *args: str) -> str:
        result = self.helm(*args)
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def manifest(self) -> str:
        """What the release installed, as ``helm get manifest`` lists it (the templates, no CRDs)."""
        return self.ok("get", "manifest", RELEASE, "--namespace", SYSTEM)

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.plane.binaries.kubectl), "--kubeconfig", str(self.plane.kubeconfig), *args],
                              input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)


def identities(manifest: str) -> set[tuple[str, str, str]]:
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
            for d in yaml.safe_load_all(manifest) if d}


def released(binary: Path, control_plane: ControlPlane, kube_api_client: client.ApiClient,
             home: Path) -> Iterator[Release]:
    """A :class:`Release` of ``binary`` on a cluster without gpupool's namespaces, cleaned up after
    the caller's tests whatever happened (``yield from`` in a module fixture)."""
    core_v1 = client.CoreV1Api(kube_api_client)
    present = {n.metadata.name for n in core_v1.list_namespace().items} & set(NAMESPACES)
    assert not present, f"gpupool's namespaces exist before the chart is installed: {sorted(present)}"
    extensions = client.ApiextensionsV1Api(kube_api_client)
    crds_before = {c.metadata.name for c in extensions.list_custom_resource_definition().items} & set(CRDS)
    state = Release(binary, control_plane, home)
    try:
        yield state
    finally:
        if RELEASE in state.helm("list", "--all-namespaces", "--short").stdout.split():
            state.helm("uninstall", RELEASE, "--namespace", SYSTEM)
        for manifest in state.manifests:  # cluster-scoped objects would outlive the namespaces
            state.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=manifest)
        for name in NAMESPACES:
            try:
                delete_namespace(core_v1, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        created = set(CRDS) - crds_before
        for name in created:
            try:
                extensions.delete_custom_resource_definition(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise

        wait_crds_gone(extensions, created)  # the next module's install must find none terminating
