"""The ``gpupool`` command line: one group, one sub-command per job.

click is used because it gives typed, composable sub-commands with good ``--help`` output and is
maintained by the Pallets team; argparse would need more code for the same result.
"""

from __future__ import annotations

import click

from gpupool import __version__
from gpupool.cli.extender_cmd import extender
from gpupool.cli.node_agent_cmd import node_agent
from gpupool.cli.simulate_cmd import simulate
from gpupool.cli.testenv_cmd import testenv


@click.group()
@click.version_option(__version__, prog_name="gpupool")
def cli() -> None:
    """GPU sharing for Kubernetes."""


cli.add_command(simulate)
cli.add_command(extender)
cli.add_command(node_agent)
cli.add_command(testenv)


def main() -> None:
    """Entry point of the ``gpupool`` console script."""
    cli()
