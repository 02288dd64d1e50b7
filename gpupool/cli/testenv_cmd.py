"""``gpupool testenv build|up|down|env``: a real Kubernetes on this machine, for tests and demos.

``up`` starts the components in the background and exits; ``down`` stops them from the state file
``up`` wrote. Use ``eval "$(gpupool testenv env)"`` to point kubectl and clients at the cluster.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import click

from gpupool.testenv.build import ensure_binaries
from gpupool.testenv.config import ExtenderConfig
from gpupool.testenv.controlplane import start_control_plane
from gpupool.testenv.errors import TestenvError
from gpupool.testenv.helm import HELM_3, ensure_helm
from gpupool.testenv.kubelet import created_mount_points, start_kubelet
from gpupool.testenv.node_runtime import RuntimeKind
from gpupool.testenv.procs import ManagedProcess
from gpupool.testenv.statefile import (
    EnvState,
    default_state_dir,
    load_state,
    save_state,
    stop_state,
)
from gpupool.testenv.versions import NEWEST, RELEASES, VERSION_ENV

_state_dir_option = click.option(
    "--state-dir", type=click.Path(path_type=Path), default=None,
    help="Where the running environment keeps its files (default $GPUPOOL_TESTENV_STATE or "
         "/tmp/gpupool-testenv).",
)


def _progress(message: str) -> None:
    click.echo(f"testenv: {message}", err=True)


@click.group("testenv")
def testenv() -> None:
    """A real, current Kubernetes (control plane, kubelets, containerd) on this machine."""


_version_option = click.option(
    "--version", "version", default=None, metavar="VERSION",
    help=f"Kubernetes release to build and run: {', '.join(r.kubernetes for r in RELEASES)} or a minor such as "
         f"{RELEASES[-1].minor} (default ${VERSION_ENV} or {NEWEST.kubernetes}).",
)


@testenv.command("build")
@_version_option
@click.option("--helm3/--no-helm3", default=True, show_default=True,
              help="Also build Helm 3 (the chart's Helm 3 tests). The test command builds it in its second "
                   "lane, beside the end-to-end suite, rather than before both lanes.")
def build_cmd(version: str | None, helm3: bool) -> None:
    """Build (or find in the cache) helm (4, and 3 unless --no-helm3) for the chart's tests, then the
    binaries; a cache hit returns at once."""
    started = time.monotonic()
    try:
        helm = ensure_helm(log=_progress)
        helm3_path = ensure_helm(log=_progress, release=HELM_3) if helm3 else None
        binaries = ensure_binaries(log=_progress, version=version)
    except (TestenvError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    for name, path in vars(binaries).items():
        click.echo(f"{name}: {path}")
    click.echo(f"helm: {helm}")
    if helm3_path is not None:
        click.echo(f"helm3: {helm3_path}")
    _progress(f"done in {time.monotonic() - started:.1f}s")


@testenv.command("up")
@_state_dir_option
@_version_option
@click.option("--kubelet", "nodes", multiple=True, metavar="NODE",
              help="Also start a kubelet registering this node; repeatable.")
@click.option("--runtime", type=click.Choice([k.value for k in RuntimeKind]), default=RuntimeKind.FAKE.value,
              show_default=True,
              help="The kubelets' container runtime: the fake CRI (no processes) or containerd (real "
                   "containers; installs containerd, runc, CNI plugins and busybox-static with apt on first use).")
@click.option("--extender-url", default=None, help="Point kube-scheduler at an extender at this URL prefix.")
@click.option("--managed-resource", "managed", multiple=True, metavar="NAME",
              help="Extended resource the extender manages (ignoredByScheduler); repeatable.")
@click.option("--bind-verb", default=None, help="Let the extender bind pods with this verb (e.g. bind).")
@click.option("--demo", is_flag=True,
              help="Also run gpupool on it: the extender, gpupool's scheduler and a node agent with two fake GPUs "
                   "on a kubelet; prints a GPU pod to apply (docs/testenv.md, \"Try gpupool\").")
def up_cmd(state_dir: Path | None, version: str | None, nodes: tuple[str, ...], runtime: str, extender_url: str | None,
           managed: tuple[str, ...], bind_verb: str | None, demo: bool) -> None:
    """Start etcd, kube-apiserver, kube-scheduler (and kubelets) in the background."""
    if demo and (extender_url or nodes or runtime != RuntimeKind.FAKE.value):
        raise click.UsageError("--demo starts its own extender and node (fake runtime): "
                               "leave out --extender-url, --kubelet and --runtime")
    state_dir = state_dir or default_state_dir()
    previous = load_state(state_dir)
    if previous is not None and previous.running():
        raise click.ClickException(f"already up (state in {state_dir}); run `gpupool testenv down` first")
    if previous is not None:
        stop_state(state_dir, previous)  # leftovers of a crashed run
    extenders: tuple[ExtenderConfig, ...] = ()
    if extender_url:
        extenders = (ExtenderConfig(url_prefix=extender_url, bind_verb=bind_verb,
                                    managed_resources=managed),)
    if demo:
        from gpupool.cli.testenv_demo import DEMO_NODE

        nodes = (DEMO_NODE,)
    started = time.monotonic()
    demo_processes: list[ManagedProcess] = []
    try:
        binaries = ensure_binaries(log=_progress, version=version)
        _progress(f"Kubernetes {binaries.version}")
        plane = start_control_plane(binaries, state_dir=state_dir, extenders=extenders)
        plane.remove_state_on_stop = False
        state = EnvState(control_plane=plane.to_record())
        save_state(state_dir, state)
        _progress(f"control plane ready at {plane.server} in {time.monotonic() - started:.1f}s")
        for node in nodes:
            kubelet = start_kubelet(plane, node, runtime=runtime, log=_progress)
            state.kubelets.append(kubelet.to_record())
            state.created_mount_points = [str(p) for p in created_mount_points()]
            save_state(state_dir, state)
            _progress(f"node {node} Ready ({kubelet.node_ip}:{kubelet.port}, {runtime} runtime)")
            if kubelet.runtime.images is not None:
                images = kubelet.runtime.images
                _progress(f"node {node} images (imagePullPolicy: Never): {images.busybox.ref} "
                          f"{images.dynamic.ref}")
            if demo:
                from gpupool.cli.testenv_demo import guide, start_demo

                try:
                    started_demo = start_demo(plane, kubelet, state_dir / "demo", log=_progress,
                                              started=demo_processes)
                except TestenvError:
                    raise
                except Exception as exc:  # an API error while setting up: stop everything, say what
                    raise TestenvError(f"the demo could not start: {exc}") from exc
                state.processes = [p.to_record() for p in demo_processes]
                save_state(state_dir, state)
                _progress(f"gpupool demo ready in {time.monotonic() - started:.1f}s")
                option = "" if state_dir == default_state_dir() else f" --state-dir {shlex.quote(str(state_dir))}"
                click.echo(guide(started_demo, plane, state_dir, option))
                return
    except (TestenvError, ValueError) as exc:
        for process in reversed(demo_processes):
            process.stop()
        recorded = load_state(state_dir)
        if recorded is not None:
            stop_state(state_dir, recorded)
        raise click.ClickException(str(exc)) from exc
    _print_env(state_dir)


@testenv.command("down")
@_state_dir_option
def down_cmd(state_dir: Path | None) -> None:
    """Stop everything `up` started and delete its state directory."""
    state_dir = state_dir or default_state_dir()
    state = load_state(state_dir)
    if state is None:
        _progress(f"nothing to stop (no state in {state_dir})")
        return
    stop_state(state_dir, state)
    _progress("stopped")


@testenv.command("env")
@_state_dir_option
def env_cmd(state_dir: Path | None) -> None:
    """Print `export KUBECONFIG=...` for the running environment (use with eval)."""
    _print_env(state_dir or default_state_dir())


def _print_env(state_dir: Path) -> None:
    state = load_state(state_dir)
    if state is None:
        raise click.ClickException(f"no test environment recorded in {state_dir}; run `gpupool testenv up`")
    click.echo(f"export KUBECONFIG={shlex.quote(str(state.kubeconfig))}")
    click.echo(f"export GPUPOOL_TESTENV_STATE={shlex.quote(str(state_dir))}")
