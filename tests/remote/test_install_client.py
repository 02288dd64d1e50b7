"""``gpupool remote-gpu install-client``, the init container of a pod with a remote share
(gpupool/remotegpu/install_client.py): a local share gets the local-share placeholder at the
client's path, a remote one copies the client and waits for the grant Secret's endpoint and token."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli.remote_gpu_cmd import remote_gpu
from gpupool.remotegpu.install_client import InstallError, install_client

SHARE = '{"v": 1, "server": "gpu-7"}'


def client_file(tmp_path: Path, runtime: bool = True) -> Path:
    """The client's directory as the build leaves it: the client, and gpupool's CUDA runtime, cuBLAS
    and cuBLASLt beside it (``runtime`` False: an image built before any of them)."""
    source = tmp_path / "built" / "libcuda.so.1"
    source.parent.mkdir()
    source.write_bytes(b"\x7fELF the client")
    if runtime:
        (source.parent / "libcudart.so.12").write_bytes(b"\x7fELF the runtime")
        (source.parent / "libcublas.so.12").write_bytes(b"\x7fELF the cuBLAS")
        (source.parent / "libcublasLt.so.12").write_bytes(b"\x7fELF the cuBLASLt")
    return source


def test_a_local_share_gets_the_placeholder_at_the_clients_path_and_waits_for_nothing(tmp_path: Path) -> None:
    """The webhook's LD_PRELOAD names lib/libcuda.so.1, lib/libcudart.so.12, lib/libcublas.so.12 and
    lib/libcublasLt.so.12 whatever the share turns out to be: a local share finds the placeholder at
    all four (tests/remote/test_local_share_placeholder.py runs programs with them), not the client
    and gpupool's runtime, cuBLAS and cuBLASLt, and no grant is waited for."""
    placeholder = tmp_path / "built" / "libgpupool-local-share.so"
    placeholder.parent.mkdir()
    placeholder.write_bytes(b"\x7fELF the placeholder")
    said = install_client("", tmp_path / "missing", tmp_path / "lib", tmp_path / "grant", wait_s=0,
                          placeholder=placeholder)
    installed, runtime = tmp_path / "lib" / "libcuda.so.1", tmp_path / "lib" / "libcudart.so.12"
    assert installed.read_bytes() == b"\x7fELF the placeholder" and installed.stat().st_mode & 0o777 == 0o755
    assert runtime.read_bytes() == b"\x7fELF the placeholder" and runtime.stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "lib" / "libcublas.so.12").read_bytes() == b"\x7fELF the placeholder"
    assert (tmp_path / "lib" / "libcublasLt.so.12").read_bytes() == b"\x7fELF the placeholder"
    assert "local-share placeholder" in said and str(installed) in said and str(runtime) in said
    assert sorted(p.name for p in (tmp_path / "lib").iterdir()) == ["libcublas.so.12", "libcublasLt.so.12",
                                                                   "libcuda.so.1", "libcudart.so.12"]


def test_a_local_share_still_starts_without_a_placeholder(tmp_path: Path) -> None:
    """An image without one (or an emptyDir that refuses the copy) must not fail the pod: the share
    works, only the loader's line comes back."""
    said = install_client("", tmp_path / "missing", tmp_path / "lib", tmp_path / "grant", wait_s=0)
    assert "no local-share placeholder" in said and not (tmp_path / "lib").exists()
    (tmp_path / "file").write_text("not a directory")
    said = install_client("", tmp_path / "missing", tmp_path / "file" / "lib", tmp_path / "grant", wait_s=0,
                          placeholder=tmp_path / "file")
    assert "could not be installed" in said


def test_a_remote_share_gets_the_client_once_the_grant_is_mounted(tmp_path: Path) -> None:
    grant = tmp_path / "grant"
    grant.mkdir()
    (grant / "remote_endpoint").write_text("10.0.0.7:9420")
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # kubelet fills the Secret volume in while the container waits
        waits.append(seconds)
        (grant / "remote_token").write_text("t" * 43)

    said = install_client(SHARE, client_file(tmp_path), tmp_path / "lib", grant, wait_s=60, sleep=sleep)
    installed, runtime = tmp_path / "lib" / "libcuda.so.1", tmp_path / "lib" / "libcudart.so.12"
    assert installed.read_bytes() == b"\x7fELF the client" and installed.stat().st_mode & 0o777 == 0o755
    assert runtime.read_bytes() == b"\x7fELF the runtime" and runtime.stat().st_mode & 0o777 == 0o755
    assert waits == [0.5] and str(installed) in said and f"gpupool's CUDA runtime as {runtime}" in said
    blas = tmp_path / "lib" / "libcublas.so.12"
    assert blas.read_bytes() == b"\x7fELF the cuBLAS" and f"gpupool's cuBLAS as {blas}" in said
    blas_lt = tmp_path / "lib" / "libcublasLt.so.12"
    assert blas_lt.read_bytes() == b"\x7fELF the cuBLASLt" and f"gpupool's cuBLASLt as {blas_lt}" in said
    # no staging file left
    assert sorted(p.name for p in (tmp_path / "lib").iterdir()) == ["libcublas.so.12", "libcublasLt.so.12",
                                                                   "libcuda.so.1", "libcudart.so.12"]


def test_a_client_built_without_the_runtime_gets_the_placeholder_in_its_place(tmp_path: Path) -> None:
    """An image built before gpupool's CUDA runtime and cuBLAS existed: the preloaded paths still hold
    a loadable object (the placeholder), and the program keeps NVIDIA's libraries, as before."""
    grant = tmp_path / "grant"
    grant.mkdir()
    for key in ("remote_endpoint", "remote_token"):
        (grant / key).write_text("x")
    placeholder = tmp_path / "placeholder.so"
    placeholder.write_bytes(b"\x7fELF the placeholder")
    said = install_client(SHARE, client_file(tmp_path, runtime=False), tmp_path / "lib", grant, wait_s=0,
                          placeholder=placeholder)
    assert (tmp_path / "lib" / "libcudart.so.12").read_bytes() == b"\x7fELF the placeholder"
    assert "no CUDA runtime beside the client, the placeholder as" in said
    assert (tmp_path / "lib" / "libcublas.so.12").read_bytes() == b"\x7fELF the placeholder"
    assert "no cuBLAS beside the client, the placeholder as" in said
    assert (tmp_path / "lib" / "libcublasLt.so.12").read_bytes() == b"\x7fELF the placeholder"
    assert "no cuBLASLt beside the client, the placeholder as" in said


def test_a_grant_that_never_comes_fails_with_the_reason(tmp_path: Path) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    (tmp_path / "grant").mkdir()
    (tmp_path / "grant" / "remote_token").write_text("   \n")  # blank counts as missing
    with pytest.raises(InstallError, match=r"gpupool-remote.*--remote-gpu-server"):
        install_client(SHARE, client_file(tmp_path), tmp_path / "lib", tmp_path / "grant", wait_s=5,
                       clock=lambda: now[0], sleep=sleep)
    assert now[0] == 5.0


def test_the_command_reads_the_share_from_the_downward_apis_variable(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    source = client_file(tmp_path)
    monkeypatch.setattr("gpupool.shim.remote_build.client_directory", lambda: source.parent)
    grant = tmp_path / "grant"
    grant.mkdir()
    args = ["install-client", "--into", str(tmp_path / "lib"), "--grant", str(grant), "--wait", "0"]
    placeholder = tmp_path / "built" / "libgpupool-local-share.so"
    placeholder.write_bytes(b"\x7fELF the placeholder")
    monkeypatch.setattr("gpupool.shim.remote_build.placeholder_library", lambda: placeholder)
    local = CliRunner().invoke(remote_gpu, args, env={"GPUPOOL_REMOTE_SHARE": ""})
    assert local.exit_code == 0 and "local-share placeholder" in local.output
    assert (tmp_path / "lib" / "libcuda.so.1").read_bytes() == placeholder.read_bytes()
    missing = CliRunner().invoke(remote_gpu, args, env={"GPUPOOL_REMOTE_SHARE": SHARE})
    assert missing.exit_code == 1 and "no remote_endpoint and remote_token" in missing.output
    threading.Timer(0.2, lambda: [(grant / k).write_text("x") for k in ("remote_endpoint", "remote_token")]).start()
    done = CliRunner().invoke(remote_gpu, [*args[:-1], "10"], env={"GPUPOOL_REMOTE_SHARE": SHARE})
    assert done.exit_code == 0, done.output
    assert (tmp_path / "lib" / "libcuda.so.1").read_bytes() == source.read_bytes()
    assert (tmp_path / "lib" / "libcudart.so.12").read_bytes() == b"\x7fELF the runtime"
    assert (tmp_path / "lib" / "libcublas.so.12").read_bytes() == b"\x7fELF the cuBLAS"
    assert (tmp_path / "lib" / "libcublasLt.so.12").read_bytes() == b"\x7fELF the cuBLASLt"


def test_check_server_name_writes_the_scheduled_node_beside_the_client(tmp_path: Path) -> None:
    """The name comes from the pod's remote-share-v1 (the extender's), never from the grant Secret
    (the serving node's agent's): the client then requires the server's certificate to name it."""
    import datetime as dt

    from gpupool.api.annotations import CardRef
    from gpupool.api.remote_share import RemoteShare, encode_remote_share
    from gpupool.remotegpu.install_client import SERVER_NAME_FILE

    share = encode_remote_share(RemoteShare(server="gpu-7", time=dt.datetime(2026, 11, 29, tzinfo=dt.UTC),
                                            container="main", pod_uid="u", card=CardRef(0, "GPU-7-0", 4000, 300)))
    grant = tmp_path / "grant"
    grant.mkdir()
    for key in ("remote_endpoint", "remote_token"):
        (grant / key).write_text("x")
    source = client_file(tmp_path)
    install_client(share, source, tmp_path / "lib", grant, wait_s=0)
    assert not (tmp_path / "lib" / SERVER_NAME_FILE).exists()  # off unless asked
    install_client(share, source, tmp_path / "lib", grant, wait_s=0, check_server_name=True)
    assert (tmp_path / "lib" / SERVER_NAME_FILE).read_text() == "gpu-7\n"
    with pytest.raises(InstallError, match="its server's name is unknown"):
        install_client(SHARE, source, tmp_path / "lib", grant, wait_s=0, check_server_name=True)


def test_the_command_starts_a_local_share_where_no_placeholder_can_be_had(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.shim.build import ShimBuildError

    def no_placeholder() -> Path:
        raise ShimBuildError("no prebuilt placeholder and no C compiler")

    monkeypatch.setattr("gpupool.shim.remote_build.placeholder_library", no_placeholder)
    args = ["install-client", "--into", str(tmp_path / "lib"), "--grant", str(tmp_path / "grant"), "--wait", "0"]
    local = CliRunner().invoke(remote_gpu, args, env={"GPUPOOL_REMOTE_SHARE": ""})
    assert local.exit_code == 0 and "no local-share placeholder" in local.output
