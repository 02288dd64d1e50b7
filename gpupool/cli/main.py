"""The ``gpupool`` command line: one group, one sub-command per job.

click is used because it gives typed, composable sub-commands with good ``--help`` output and is
maintained by the Pallets team; argparse would need more code for the same result.

Sub-commands are imported only when they run: the extender and node agent pull in the Kubernetes
client, gRPC and Prometheus (a start-up delay a person notices), which ``gpupool simulate`` never
needs.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from gpupool import __version__

#: Sub-command name -> ``module:attribute`` of its click command, loaded on first use.
SUBCOMMANDS = {
    "simulate": "gpupool.cli.simulate_cmd:simulate",
    "extender": "gpupool.cli.extender_cmd:extender",
    "node-agent": "gpupool.cli.node_agent_cmd:node_agent",
    "shim": "gpupool.cli.shim_cmd:shim",
    "testenv": "gpupool.cli.testenv_cmd:testenv",
    "certs": "gpupool.cli.certs_cmd:certs",
    "groups": "gpupool.cli.groups_cmd:groups_cli",
    "remote-gpu": "gpupool.cli.remote_gpu_cmd:remote_gpu",
}


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported when invoked or asked for help, not at start."""

    def __init__(self, name: str | None = None, *, lazy: dict[str, str], **attrs: Any) -> None:
        super().__init__(name, **attrs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy:
            module_name, attribute = self._lazy[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{self._lazy[cmd_name]} is not a click command")
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, lazy=SUBCOMMANDS)
@click.version_option(__version__, prog_name="gpupool")
def cli() -> None:
    """GPU sharing for Kubernetes."""


def main() -> None:
    """Entry point of the ``gpupool`` console script."""
    cli()
