"""``gpupool remote-gpu serve``: the GPU server of remote shares (docs/remote-gpu.md)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

import click

from gpupool.shim.build import ShimBuildError


@click.group("remote-gpu")
def remote_gpu() -> None:
    """GPUs used over the network by pods on other nodes."""


@remote_gpu.command("client-path")
def client_path_cmd() -> None:
    """Print the directory holding the GPU client built as libcuda.so.1 (what a container on a node
    without GPUs mounts in place of the driver), building it first if needed."""
    from gpupool.shim.remote_build import client_directory

    try:
        click.echo(client_directory().resolve())
    except ShimBuildError as exc:
        raise click.ClickException(str(exc)) from exc


@remote_gpu.command("install-client")
@click.option("--into", "into", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to copy the GPU client to as libcuda.so.1, gpupool's CUDA runtime as "
                   "libcudart.so.12, gpupool's cuBLAS as libcublas.so.12 and its cuBLASLt as "
                   "libcublasLt.so.12 (the pod's volume its GPU container preloads them from).")
@click.option("--grant", "grant", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Where the pod's grant Secret is mounted: waited for until it holds remote_endpoint and "
                   "remote_token.")
@click.option("--share", default="", envvar="GPUPOOL_REMOTE_SHARE", show_envvar=True,
              help="The pod's remote-share-v1 annotation (the downward API's); empty: a local share, the "
                   "local-share placeholder (loads nothing) is put where the client and runtime would be.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="Seconds to wait for the grant before failing.")
@click.option("--check-server-name", is_flag=True,
              help="Also write the share's server node beside the client (remote_server_name): the client then "
                   "requires the server's certificate to name that node (GPU nodes' own certificates, the "
                   "extender's --remote-gpu-signer).")
def install_client_cmd(into: Path, grant: Path, share: str, wait_s: float, check_server_name: bool) -> None:
    """Install the GPU client in a pod with a remote share (the init container the pod-scheduler
    webhook adds; docs/remote-gpu.md, "What the webhook injects")."""
    from gpupool.remotegpu.install_client import CLIENT_NAME, InstallError, install_client
    from gpupool.shim.remote_build import client_directory, placeholder_library

    try:
        remote = bool(share.strip())
        source = client_directory() / CLIENT_NAME if remote else Path()
        placeholder = _placeholder(placeholder_library)
        click.echo(install_client(share, source, into, grant, wait_s=wait_s, check_server_name=check_server_name,
                                  placeholder=placeholder))
    except (ShimBuildError, InstallError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc


def _placeholder(find: Callable[[], Path]) -> Path | None:
    """The local-share placeholder, or None where the image has none and nothing can build it (a
    local share then still starts, with the loader's line)."""
    try:
        return find()
    except ShimBuildError:
        return None


@remote_gpu.command("build")
@click.option("--into", "directory", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write gpupool-remote-server, remote-client/libcuda.so.1, gpupool's libcudart.so.12, "
                   "libcublas.so.12 and libcublasLt.so.12 and the local-share placeholder beside it to; the package's "
                   "gpupool/shim/lib makes them the installation's (what the image does).")
def build_cmd(directory: Path) -> None:
    """Build the GPU server and client (needs a C compiler and OpenSSL 3's headers) into a directory."""
    from gpupool.shim.remote_build import build_into

    try:
        server, client = build_into(directory)
    except ShimBuildError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{server}\n{client}")


@remote_gpu.command("serve")
@click.option("--listen", required=True, metavar="HOST:PORT", help="Address to listen on (port 0: any free one).")
@click.option("--clients", "clients_file", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The node agent's clients file (JSON); re-read when it changes.")
@click.option("--driver", default="libcuda.so.1", show_default=True, metavar="PATH",
              help="The CUDA driver library the server runs calls on.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Speak TLS with this certificate chain (PEM); clients check it against their remote_tls_ca.")
@click.option("--tls-key", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The private key (PEM) of --tls-cert.")
@click.option("--enforce-compute", is_flag=True,
              help="Hold each client to its compute_percent: its calls run in a process under gpupool's "
                   "interception library with the client's share as its limits.")
@click.option("--allow-plain", is_flag=True,
              help="Serve plain TCP on a non-loopback address without TLS (tokens and data cross the network "
                   "in the clear).")
@click.option("--status", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Keep this file (JSON, no tokens) listing the clients connected now, per pod and card "
                   "[default: remote-gpu-connections.json beside --clients].")
@click.option("--cublas", default=None, metavar="PATH",
              help="NVIDIA's libcublas.so.12 (libcublasLt.so.12 beside it) that runs the clients' cuBLAS calls "
                   "[default: $GPUPOOL_REMOTE_CUBLAS, else the nvidia-cublas-cu12 wheel's in this Python, else "
                   "libcublas.so.12 on the library path; the log says which, or that none was found].")
def serve_cmd(listen: str, clients_file: Path, driver: str, tls_cert: Path | None, tls_key: Path | None,
              enforce_compute: bool, allow_plain: bool, status: Path | None, cublas: str | None) -> None:
    """Serve the CUDA driver of this node to the remote clients the clients file names."""
    from gpupool.remotegpu.serve import RemoteServeError, TlsFiles, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    tls = TlsFiles(tls_cert, tls_key) if tls_cert is not None and tls_key is not None else None
    try:
        code = serve(listen, clients_file, driver=driver, allow_plain=allow_plain, tls=tls,
                     enforce_compute=enforce_compute, status=status, cublas=cublas)
    except (RemoteServeError, ShimBuildError) as exc:
        raise click.ClickException(str(exc)) from exc
    sys.exit(code)
