"""containerd 2 as the test environment starts it, with one real container and no kubelet.

Marked ``e2e``: it needs the runtime the test environment builds (minutes cold, a few stamp reads
warm) and root for the mount namespace and the bridge; it needs no control plane, so it runs
alone too (``pytest -m e2e tests/testenv/test_testenv_containerd_real.py``, a few seconds warm).
Skipped, with the reason, where the runtime cannot be installed or built.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from gpupool.testenv.containerd import RUNTIME_STATE_PATHS, Containerd, start_containerd, stop_containerd
from gpupool.testenv.errors import BuildImpossibleError
from gpupool.testenv.images import Image, busybox_image
from gpupool.testenv.mountns import claim_mount_points, release_mount_points
from gpupool.testenv.runtime_tools import RuntimeTools, ensure_runtime_tools, runtime_impossible_reason
from gpupool.testenv.versions import CONTAINERD

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tools() -> RuntimeTools:
    """The built runtime, or a skip saying why it cannot exist here."""
    if os.geteuid() != 0:
        pytest.skip("a node's containerd needs root (mount namespace, bridge)")
    reason = runtime_impossible_reason()
    if reason is not None:
        pytest.skip(f"real containers cannot run on this machine: {reason}")
    try:
        return ensure_runtime_tools(log=lambda m: print(f"[gpupool testenv] {m}", flush=True))
    except BuildImpossibleError as exc:
        pytest.skip(f"real containers cannot run on this machine: {exc}")


@pytest.fixture(scope="module")
def busybox(tools: RuntimeTools) -> Image:
    return busybox_image(tools)


@pytest.fixture
def containerd(tools: RuntimeTools, busybox: Image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    """A node's containerd with busybox imported (it also stands in as the sandbox image: ``ctr``
    starts no sandbox, so the test needs no Kubernetes source for the pause image)."""
    owner = f"containerd-test-{uuid.uuid4().hex[:6]}"
    directory = tmp_path_factory.mktemp("node")
    claim_mount_points(owner, list(RUNTIME_STATE_PATHS))
    try:
        runtime = start_containerd(directory, tools=tools, binds={}, cwd=directory, pause=busybox)
        try:
            yield runtime
        finally:
            stop_containerd(runtime.to_record())
    finally:
        release_mount_points(owner)


def run(runtime: Containerd, image: Image, *argv: str, flags: Sequence[str] = ()) -> str:
    """``ctr run --rm [flags]`` one container to completion; its output.

    ``--fifo-dir``: ``ctr`` runs on the host and the shim in the node's namespace, whose
    ``/run/containerd`` (ctr's default for the stdio FIFOs) is private, so both must name a
    directory they share.
    """
    fifos = runtime.layout.directory / "fifo"
    fifos.mkdir(exist_ok=True)
    return runtime.ctr("run", "--rm", "--fifo-dir", str(fifos), *flags, image.ref, f"t-{uuid.uuid4().hex[:8]}",
                       *argv)


def test_containerd_is_version_2_with_the_built_programs(containerd: Containerd) -> None:
    out = containerd.ctr("version")
    server = out.partition("Server:")[2]
    assert f"Version:  {CONTAINERD}" in server, out
    assert containerd.tools.shim.is_file()


def test_a_container_runs_and_prints(containerd: Containerd, busybox: Image) -> None:
    assert run(containerd, busybox, "echo", "hello from containerd 2") == "hello from containerd 2\n"


def test_runc_applies_seccomp(containerd: Containerd, busybox: Image) -> None:
    """kubelet asks for ``RuntimeDefault`` seccomp for every sandbox: a runc built without
    seccomp would refuse every pod. ``--seccomp`` is containerd's default profile."""
    status = run(containerd, busybox, "grep", "Seccomp:", "/proc/self/status", flags=["--seccomp"])
    assert status.split() == ["Seccomp:", "2"]  # 2: filter mode


def test_a_container_gets_its_namespace_cgroup(containerd: Containerd, busybox: Image) -> None:
    """Without a cgroup parent (kubelet's ``cgroupsPerQOS: false``, or ``ctr``) containerd puts a
    container in ``/k8s.io/<container id>``: the unified (v2) line says so on cgroup v2 and on a
    hybrid v1 host alike (runc joins the unified hierarchy there too)."""
    lines = run(containerd, busybox, "cat", "/proc/self/cgroup").splitlines()
    unified = [line for line in lines if line.startswith("0::")]
    assert len(unified) == 1 and unified[0].startswith("0::/k8s.io/t-"), lines


def test_stop_leaves_no_shim_behind(tools: RuntimeTools, busybox: Image,
                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    owner = f"containerd-test-{uuid.uuid4().hex[:6]}"
    directory = tmp_path_factory.mktemp("node")
    claim_mount_points(owner, list(RUNTIME_STATE_PATHS))
    try:
        runtime = start_containerd(directory, tools=tools, binds={}, cwd=directory, pause=busybox)
        fifos = directory / "fifo"
        fifos.mkdir()
        runtime.ctr("run", "-d", "--fifo-dir", str(fifos), busybox.ref, "sleeper", "sleep", "600")
        stop_containerd(runtime.to_record())
    finally:
        release_mount_points(owner)
    assert not any(_shim_of(Path(f"/proc/{pid}"), runtime.layout.socket) for pid in _pids())


def _pids() -> list[str]:
    return [entry.name for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _shim_of(proc: Path, socket: Path) -> bool:
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(argv) and argv[0].endswith(b"containerd-shim-runc-v2") and str(socket).encode() in argv
