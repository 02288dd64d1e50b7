"""Old spellings of renamed flags: hidden, still working, with a warning.

A DaemonSet or Deployment written for an older release keeps its args across an image upgrade; a
flag that vanished would crash-loop the component. So a renamed flag keeps its old name as a hidden
alias that warns on every start, until the admin renames it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

F = TypeVar("F", bound=Callable[..., Any])


def _warn(old: str, new: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def warn(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is not None:
            click.echo(f"warning: {old} is deprecated and will be removed; use {new}", err=True)
        return value
    return warn


def old_spelling(old: str, new: str, param: str, **option: Any) -> Callable[[F], F]:
    """Accept ``old`` for the flag ``new`` (the command's parameter ``param``). Apply it above the
    decorator that declares ``new`` (or above one that consumes ``param``); ``option``: the new
    flag's ``type`` and the like, so the old value is converted alike. Both given with different
    values is a usage error."""
    hidden = f"old_{param}"

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def merged(*args: Any, **kwargs: Any) -> Any:
            value = kwargs.pop(hidden)
            if value is not None:
                ctx = click.get_current_context()
                given = ctx.get_parameter_source(param) not in (ParameterSource.DEFAULT, None)
                if given and kwargs[param] != value:
                    raise click.UsageError(f"{new} {kwargs[param]} and its old spelling {old} {value} disagree; "
                                           f"give only {new}")
                kwargs[param] = value
            return command(*args, **kwargs)

        decorated: Any = click.option(old, hidden, default=None, hidden=True, callback=_warn(old, new),
                                      **option)(merged)
        return decorated  # type: ignore[no-any-return]
    return decorate
