"""What the pod-scheduler webhook adds to a new pod that asks for a remote share, so that a pod made
by a controller (a Deployment's, a Job's: named by ``generateName``) reaches its GPU server with
nothing remote-specific in its spec but the request.

The two things the pod needs on its node, which may be a node without GPUs and without gpupool's
agent (docs/remote-gpu.md, "What the webhook injects"):

* **the GPU client library** (``libcuda.so.1`` of the GPU client), gpupool's CUDA runtime
  (``libcudart.so.12``, for programs on the CUDA runtime), gpupool's cuBLAS
  (``libcublas.so.12``, forwarding cuBLAS calls) and gpupool's cuBLASLt (``libcublasLt.so.12``,
  refusing cuBLASLt's matmul calls cleanly): an init container of gpupool's image
  (``gpupool remote-gpu install-client``) copies them into an ``emptyDir`` and the GPU container
  preloads the four (``LD_PRELOAD``). The init container reads the pod's ``remote-share-v1``
  (downward API, resolved when it starts, after the bind): for a share booked on the pod's own
  node (a local share, the bind's first tier) it copies an empty placeholder library to the paths
  instead, so the node's driver is used and the loader finds the preloaded files. ``LD_PRELOAD`` is
  set whatever the share turns out to be: the webhook runs before the bind chooses the tier;
* **the grant** (endpoint, token, the server's CA): the GPU node's agent writes it in the Secret
  ``<pod>-gpupool-remote``, owned by the pod. The webhook mounts that Secret by name, which it can
  only know when the pod has one: for a pod with ``generateName`` and no name it picks the name
  itself (``generateName`` plus 5 random characters, as the apiserver would; the apiserver keeps a
  name a webhook sets). The volume is optional (a local share gets no Secret) and the init
  container waits for the token before the GPU container starts. The client library reads the
  mounted directory (``GPUPOOL_REMOTE_DIR``).

Nothing else changes: the agent, its Secret and the admission policy that confines the agent's
Secret writes to ``<pod>-gpupool-remote`` are those of pods wired by hand.

Left alone: a pod that does not ask for a remote share, one annotated
``<domain>/remote-gpu-inject: "false"`` (it wires the Secret and library itself), and one that
already has the injected volumes (a webhook called again). Pure: a function of the pod and the
random name (no API call), like the steering it rides with.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.annotations import AnnotationError
from gpupool.api.names import ResourceNames
from gpupool.api.remote_share import wants_remote
from gpupool.extender.admission import ALLOWED, Verdict

SECRET_SUFFIX = "-gpupool-remote"
"""The Secret the GPU node's agent writes for a pod (:data:`gpupool.nodeagent.remote_server.SECRET_SUFFIX`)."""
GRANT_VOLUME = "gpupool-remote-grant"
LIBRARY_VOLUME = "gpupool-remote-client"
INIT_CONTAINER = "gpupool-remote-client"
GRANT_DIR = "/var/run/gpupool-remote/grant"
"""Where the Secret is mounted: the client library's ``GPUPOOL_REMOTE_DIR``."""
LIBRARY_DIR = "/var/run/gpupool-remote/lib"
CLIENT_LIBRARY = f"{LIBRARY_DIR}/libcuda.so.1"
RUNTIME_LIBRARY = f"{LIBRARY_DIR}/libcudart.so.12"
BLAS_LIBRARY = f"{LIBRARY_DIR}/libcublas.so.12"
BLAS_LT_LIBRARY = f"{LIBRARY_DIR}/libcublasLt.so.12"
PRELOAD = f"{CLIENT_LIBRARY}:{RUNTIME_LIBRARY}:{BLAS_LIBRARY}:{BLAS_LT_LIBRARY}"
"""The client first: the runtime's and cuBLAS's ``libcuda.so.1`` is then the client, whatever else
is on the path; cuBLASLt after the cuBLAS it is linked to."""
SHARE_ENV = "GPUPOOL_REMOTE_SHARE"
"""The init container's copy of the pod's ``remote-share-v1`` (empty for a local share)."""
INIT_RESOURCES: Mapping[str, Any] = {"requests": {"cpu": "10m", "memory": "32Mi"},
                                     "limits": {"cpu": "500m", "memory": "128Mi"}}
"""A copy and a wait: small, and with limits so a namespace whose quota asks for them admits the pod."""
INIT_SECURITY: Mapping[str, Any] = {
    "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534, "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
"""Pod Security's "restricted" profile (the image's own user, nobody): it writes only the emptyDir."""
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""The apiserver's alphabet for generated names (no vowels, no look-alikes)."""
NAME_RANDOM = 5
MAX_PREFIX = 63 - NAME_RANDOM
"""The apiserver truncates ``generateName`` to this many characters before adding its own."""


def opt_out_key(domain: str) -> str:
    """The pod annotation that keeps the webhook from injecting anything (``"false"``)."""
    return f"{domain}/remote-gpu-inject"


def random_suffix() -> str:
    return "".join(secrets.choice(NAME_ALPHABET) for _ in range(NAME_RANDOM))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class RemoteInjection:
    """Builds the JSON patch of the module docstring for one pod.

    ``image`` is gpupool's image (the init container's); ``program`` the command that runs gpupool
    in it."""

    names: ResourceNames
    image: str
    program: tuple[str, ...] = ("gpupool",)
    suffix: Callable[[], str] = random_suffix
    check_server_name: bool = False
    """The init container writes the share's server node for the client to check in the server's
    certificate (``--check-server-name``): on when the extender signs GPU nodes' own certificates."""

    def verdict(self, pod: Mapping[str, Any]) -> Verdict:
        """Allowed, with the patch when the pod gets the client and its grant; refused only for an
        opt-out annotation that is neither ``"true"`` nor ``"false"``."""
        meta = _mapping(pod.get("metadata"))
        annotations = _mapping(meta.get("annotations"))
        opt_out = annotations.get(opt_out_key(self.names.domain))
        if opt_out not in (None, "true", "false"):
            return Verdict(False, f'annotation {opt_out_key(self.names.domain)} must be "true" or "false", '
                                  f"got {str(opt_out)[:64]!r}")
        try:
            remote = wants_remote(annotations, self.names)
        except AnnotationError:
            return ALLOWED  # the request's own check refuses it with the reason
        spec = _mapping(pod.get("spec"))
        index = self.gpu_container(spec)
        if not remote or opt_out == "false" or index is None or self.injected(spec):
            return ALLOWED
        name = meta.get("name") or ""
        patch: list[Mapping[str, Any]] = []
        if not name:
            prefix = meta.get("generateName")
            if not isinstance(prefix, str) or not prefix:
                return ALLOWED  # the apiserver refuses a pod without either
            name = prefix[:MAX_PREFIX] + self.suffix()
            patch.append({"op": "add", "path": "/metadata/name", "value": name})
        patch += self._appended("/spec/volumes", spec.get("volumes"), [
            {"name": GRANT_VOLUME, "secret": {"secretName": f"{name}{SECRET_SUFFIX}", "optional": True}},
            {"name": LIBRARY_VOLUME, "emptyDir": {}}])
        patch += self._init_container(spec)
        container = _mapping(_list(spec.get("containers"))[index])
        where = f"/spec/containers/{index}"
        patch += self._appended(f"{where}/volumeMounts", container.get("volumeMounts"), [
            {"name": GRANT_VOLUME, "mountPath": GRANT_DIR, "readOnly": True},
            {"name": LIBRARY_VOLUME, "mountPath": LIBRARY_DIR, "readOnly": True}])
        env, warnings = self._environment(where, container)
        patch += env
        return Verdict(True, warnings=warnings, patch=tuple(patch))

    def gpu_container(self, spec: Mapping[str, Any]) -> int | None:
        """The index of the app container that asks for a gpupool resource (the request's check
        allows exactly one for a remote share)."""
        managed = set(self.names.managed())
        for index, entry in enumerate(_list(spec.get("containers"))):
            resources = _mapping(_mapping(entry).get("resources"))
            if any(name in managed for kind in ("requests", "limits") for name in _mapping(resources.get(kind))):
                return index
        return None

    @staticmethod
    def injected(spec: Mapping[str, Any]) -> bool:
        """Whether the pod has the injected volumes already (a reinvocation of the webhook)."""
        return any(_mapping(v).get("name") in (GRANT_VOLUME, LIBRARY_VOLUME) for v in _list(spec.get("volumes")))

    def _init_container(self, spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The copier, first of the init containers (before any sidecar that might use the GPU)."""
        annotation = f"metadata.annotations['{self.names.remote_share}']"
        init = {
            "name": INIT_CONTAINER, "image": self.image,
            "command": [*self.program, "remote-gpu", "install-client", "--into", LIBRARY_DIR, "--grant", GRANT_DIR,
                        *(["--check-server-name"] if self.check_server_name else [])],
            "env": [{"name": SHARE_ENV, "valueFrom": {"fieldRef": {"fieldPath": annotation}}}],
            "volumeMounts": [{"name": LIBRARY_VOLUME, "mountPath": LIBRARY_DIR},
                             {"name": GRANT_VOLUME, "mountPath": GRANT_DIR, "readOnly": True}],
            "resources": INIT_RESOURCES,
            "securityContext": INIT_SECURITY,
        }
        if isinstance(spec.get("initContainers"), list) and spec["initContainers"]:
            return [{"op": "add", "path": "/spec/initContainers/0", "value": init}]
        return [{"op": "add", "path": "/spec/initContainers", "value": [init]}]

    def _environment(self, where: str, container: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]],
                                                                                tuple[str, ...]]:
        """``GPUPOOL_REMOTE_DIR`` and ``LD_PRELOAD`` (put in front of a preload the container sets
        itself; one it takes from elsewhere is left, with a warning)."""
        env = _list(container.get("env"))
        added: list[Mapping[str, Any]] = [{"name": "GPUPOOL_REMOTE_DIR", "value": GRANT_DIR}]
        patch: list[Mapping[str, Any]] = []
        warnings: tuple[str, ...] = ()
        preload = next(((i, _mapping(e)) for i, e in enumerate(env) if _mapping(e).get("name") == "LD_PRELOAD"), None)
        if preload is None:
            added.append({"name": "LD_PRELOAD", "value": PRELOAD})
        elif isinstance(preload[1].get("value"), str) and "valueFrom" not in preload[1]:
            value = preload[1]["value"]
            patch.append({"op": "replace", "path": f"{where}/env/{preload[0]}/value",
                          "value": f"{PRELOAD}:{value}" if value else PRELOAD})
        else:
            warnings = (f"gpupool: the container sets LD_PRELOAD from elsewhere; add {PRELOAD} to it "
                        "for the remote GPU client",)
        return self._appended(f"{where}/env", container.get("env"), added) + patch, warnings

    @staticmethod
    def _appended(path: str, current: Any, values: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Operations adding ``values`` to the list at ``path``: the list itself when there is none."""
        if not isinstance(current, list):
            return [{"op": "add", "path": path, "value": values}]
        return [{"op": "add", "path": f"{path}/-", "value": value} for value in values]

