"""``gpupool shim path|build``: the interception library the node agent mounts into containers."""

from __future__ import annotations

from pathlib import Path

import click

from gpupool.shim.build import SANITIZED, ShimBuildError, build_library, build_standin, library_path


@click.group("shim")
def shim() -> None:
    """The library that enforces memory and compute shares inside containers."""


@shim.command("path")
def path_cmd() -> None:
    """Print the absolute path of the built library, building it first if needed."""
    try:
        click.echo(library_path().resolve())
    except ShimBuildError as exc:
        raise click.ClickException(str(exc)) from exc


@shim.command("build")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the library here (default: the per-user cache).")
@click.option("--sanitize", is_flag=True, help="Build with AddressSanitizer and UndefinedBehaviorSanitizer.")
@click.option("--standin", "standin_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also build the stand-in driver (libcuda.so.1, libnvidia-ml.so.1) for tests into DIR.")
def build_cmd(output: Path | None, sanitize: bool, standin_dir: Path | None) -> None:
    """Compile the library (and optionally the stand-in driver) and print where it went."""
    try:
        built = build_library(output, flavour=SANITIZED) if sanitize else build_library(output)
        click.echo(built.resolve())
        if standin_dir is not None:
            click.echo(build_standin(standin_dir).resolve())
    except ShimBuildError as exc:
        raise click.ClickException(str(exc)) from exc
