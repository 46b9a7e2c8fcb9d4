"""The exact command that continues an interrupted run: a click command that keeps its arguments as given.

An interrupted build or training run prints the command line that continues it (``... --resume``); a build that
finds an interrupted build's parts prints the two that go on from there. The arguments are the command's own (not
``sys.argv``, which under ``python -m`` or a test runner is something else), with the flag added once."""

from __future__ import annotations

import shlex

import click

__all__ = ["KeepsArguments", "rerun_command"]

#: Where ``KeepsArguments`` keeps a command's arguments in its click context's ``meta``.
_ARGUMENTS = "weightprep.arguments"


class KeepsArguments(click.Command):
    """A click command that keeps the arguments it was given (for ``rerun_command``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[_ARGUMENTS] = list(args)
        return super().parse_args(ctx, args)


def rerun_command(flag: str, *, drop: tuple[str, ...] = (), drop_with_value: tuple[str, ...] = ()) -> str:
    """The command line that ran the current command (``weightprep build ...``, quoted as a shell takes it), with
    ``flag`` added unless it is there, the flags ``drop`` left out, and the options ``drop_with_value`` left out
    with their value (``--resume path/checkpoint-40``, ``--resume=...``; a following ``-...`` is not a value).

    >>> import click
    >>> @click.command("build", cls=KeepsArguments)
    ... @click.argument("inputs", nargs=-1)
    ... @click.option("--out")
    ... def build(inputs, out):
    ...     print(rerun_command("--resume"))
    >>> build(["raw file.jsonl", "--out", "shards"], standalone_mode=False)
    weightprep build 'raw file.jsonl' --out shards --resume
    """
    ctx = click.get_current_context()
    given = ctx.meta.get(_ARGUMENTS, [])
    args: list[str] = []
    skip_value = False
    for arg in given:
        if skip_value:
            skip_value = False
            if not arg.startswith("-"):
                continue
        if arg in drop or arg.split("=", 1)[0] in drop_with_value and "=" in arg:
            continue
        if arg in drop_with_value:
            skip_value = True
            continue
        args.append(arg)
    if flag not in args:
        args.append(flag)
    return shlex.join(["weightprep", ctx.command.name or "", *args])
