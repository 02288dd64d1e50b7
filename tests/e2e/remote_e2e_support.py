"""Shared pieces of the remote GPU end-to-end tests that inject the GPU client into a pod and run it
in real containers (tests/e2e/test_remote_gpu_injection_e2e.py, test_remote_gpu_whole_path_e2e.py).

* the images: the init container's (a shell stand-in for ``gpupool remote-gpu install-client``
  beside the GPU client and gpupool's CUDA runtime; the test images have no Python) and the app's
  (the driver API probe, bench/remote_probe.c, and no ``libcuda.so.1``);
* the GPU node's server command: ``gpupool remote-gpu serve`` of this checkout on the stand-in
  driver (card ``GPU-standin-0``);
* the extender serving the shipped pod-scheduler webhook with ``--remote-client-image``, over TLS
  with a CA of the test, registered for one namespace only.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard
from gpupool.extender.http.certificates import KeyPair, issue_ca, issue_leaf
from gpupool.extender.remote_injection import INIT_CONTAINER
from gpupool.shim.build import ShimBuildError, build_standin, find_compiler
from gpupool.shim.remote_build import build_client
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.images import build_image
from gpupool.testenv.kubelet import Kubelet
from tests.e2e.e2e_support import free_port
from tests.e2e.shipped_scheduler import write_files
from tests.e2e.test_own_scheduler_e2e import SELECTOR_KEY, webhook_configuration
from tests.e2e.trust_support import FlaggedExtender
from tests.remote.remote_support import PROBE_SOURCE, REPO

NAMES = ResourceNames()
PROBE = "/usr/local/bin/remote_probe"
PROBE_RESULT = "ok vector_add 100000 c[99999]=149998"
"""What the probe prints for ``vector_add 100000`` when every element came back right."""
CARD = GpuCard(index=0, uuid="GPU-standin-0", model="Tesla-T4", memory_mib=16384)
INSTALLER = """#!/bin/sh
# Stands in for `gpupool remote-gpu install-client --into DIR --grant DIR` (this image has no Python).
[ "$1 $2 $3 $5" = "remote-gpu install-client --into --grant" ] || { echo "unexpected: $*"; exit 2; }
if [ -z "$GPUPOOL_REMOTE_SHARE" ]; then echo "local share: nothing installed"; exit 0; fi
cp /opt/gpupool/libcuda.so.1 "$4/libcuda.so.1" || exit 1
cp /opt/gpupool/libcudart.so.12 "$4/libcudart.so.12" || exit 1
cp /opt/gpupool/libcublas.so.12 "$4/libcublas.so.12" || exit 1
cp /opt/gpupool/libcublasLt.so.12 "$4/libcublasLt.so.12" || exit 1
i=0
until [ -s "$6/remote_token" ] && [ -s "$6/remote_endpoint" ]; do
  i=$((i + 1)); [ "$i" -gt 300 ] && { echo "no grant in $6"; exit 1; }; sleep 1
done
echo "installed $4/libcuda.so.1"
"""
INSTALLED = "installed /var/run/gpupool-remote/lib/libcuda.so.1"
"""The init container's log line once it copied the client and found the grant."""


def client_dir_or_skip() -> Path:
    """The GPU client's build directory (``libcuda.so.1``, ``libcudart.so.12``); skips the test where
    no C compiler can build it."""
    try:
        find_compiler()
        return build_client()
    except ShimBuildError as exc:
        pytest.skip(f"cannot build the GPU client here: {exc}")


def init_image(kubelet: Kubelet, workdir: Path) -> str:
    """The init container's image, imported into ``kubelet``'s containerd; its reference."""
    client_dir = client_dir_or_skip()
    installer = workdir / "gpupool-installer.sh"
    installer.write_text(INSTALLER)
    installer.chmod(0o755)
    image = build_image("remote-inject-gpupool", {"/usr/local/bin/gpupool": installer,
                                                  "/opt/gpupool/libcuda.so.1": client_dir / "libcuda.so.1",
                                                  "/opt/gpupool/libcudart.so.12": client_dir / "libcudart.so.12",
                                                  "/opt/gpupool/libcublas.so.12": client_dir / "libcublas.so.12",
                                                  "/opt/gpupool/libcublasLt.so.12": client_dir / "libcublasLt.so.12"})
    kubelet.import_image(image)
    return image.ref


def app_image(kubelet: Kubelet, workdir: Path) -> str:
    """The app's image (the probe linked to the client's ``-lcuda``, no ``libcuda.so.1`` in the
    image), imported into ``kubelet``'s containerd; its reference."""
    client_dir = client_dir_or_skip()
    probe = workdir / "remote_probe"
    subprocess.run([*find_compiler(), "-O1", "-o", str(probe), str(PROBE_SOURCE), f"-L{client_dir}", "-lcuda"],
                   check=True, timeout=120)
    image = build_image("remote-inject-app", {PROBE: probe})
    kubelet.import_image(image)
    return image.ref


def stand_in_server(standin: Path, state: Path) -> tuple[str, ...]:
    """The node agent's server ``program`` running ``gpupool remote-gpu serve`` from this tree on the
    stand-in driver (the agent appends ``remote-gpu serve --listen ... --clients ...``)."""
    driver = standin / "libcuda.so.1"
    run = f"import sys; from gpupool.cli.main import main; sys.argv += ['--driver', '{driver}']; main()"
    return ("env", f"GPUPOOL_STANDIN_STATE={state}", "GPUPOOL_STANDIN_SHARED_MEMORY=1",
            f"GPUPOOL_STANDIN_MEMORY_MIB={CARD.memory_mib}", "GPUPOOL_STANDIN_KERNEL_US=1", f"PYTHONPATH={REPO}",
            f"LD_LIBRARY_PATH={standin}", sys.executable, "-c", run)


def stand_in_gpupool(directory: Path) -> Path:
    """A directory holding a ``gpupool`` that runs :func:`stand_in_server`'s program: on the front of
    a node agent's ``PATH`` it is what ``gpupool node-agent --remote-gpu-server`` starts (the agent
    runs ``gpupool remote-gpu serve``, the stand-in driver is not the node's ``libcuda.so.1``)."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "gpupool"
    script.write_text(f"#!/bin/sh\nexec {shlex.join(stand_in_server(build_standin(), directory / 'standin.state'))}"
                      ' "$@"\n')
    script.chmod(0o755)
    return directory


def listening(port: int) -> bool:
    """Whether something accepts connections on ``127.0.0.1:port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def injected(pod: Any) -> bool:
    """Whether the webhook gave the pod (a client model object) the GPU client's init container."""
    return any(c.name == INIT_CONTAINER for c in pod.spec.init_containers or [])


@dataclass(frozen=True)
class WebhookExtender:
    """The extender process serving the webhook, the CA of its certificates (which the extender's
    ``--client-ca-file`` trusts too) and the init container image it injects."""

    extender: FlaggedExtender
    ca: KeyPair
    init_ref: str


@contextmanager
def webhook_extender(control_plane: ControlPlane, kube_api_client: client.ApiClient, namespace: str,
                     kubelet: Kubelet, workdir: Path) -> Iterator[WebhookExtender]:
    """``gpupool extender`` over mutual TLS with ``--admission-port`` and ``--remote-client-image``
    (an init image imported into ``kubelet``), behind the shipped pod-scheduler webhook
    (components/scheduler-webhook/webhook.yaml: only its clientConfig pointed at the extender and its
    namespaceSelector narrowed to ``namespace``); the webhook deleted and the extender killed after."""
    init_ref = init_image(kubelet, workdir)
    ca = issue_ca("e2e-remote-inject-ca")
    server = issue_leaf(ca, "gpupool-extender", server=True, hosts=("127.0.0.1",))
    serving = write_files(workdir / "serving", {"tls.crt": server.cert_pem, "tls.key": server.key_pem,
                                                "ca.crt": ca.cert_pem})
    port = free_port()
    extender = FlaggedExtender(control_plane.kubeconfig, workdir / "extender.log", tls=True, extra_args=(
        "--tls-cert-file", str(serving / "tls.crt"), "--tls-private-key-file", str(serving / "tls.key"),
        "--client-ca-file", str(serving / "ca.crt"), "--admission-port", str(port),
        "--remote-client-image", init_ref))
    value = uuid.uuid4().hex[:8]
    client.CoreV1Api(kube_api_client).patch_namespace(namespace, {"metadata": {"labels": {SELECTOR_KEY: value}}})
    admission = client.AdmissionregistrationV1Api(kube_api_client)
    name = f"gpupool-remote-inject-{value}"
    extender.start()
    try:
        admission.create_mutating_webhook_configuration(webhook_configuration(
            name, f"https://127.0.0.1:{port}/admission/pod-scheduler", ca.cert_pem, value))
        try:
            yield WebhookExtender(extender, ca, init_ref)
        finally:
            admission.delete_mutating_webhook_configuration(name)
    finally:
        extender.kill()
