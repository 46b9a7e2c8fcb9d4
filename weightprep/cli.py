"""The ``weightprep`` command line: parses arguments and dispatches, nothing else.

Each subcommand lives beside the code it drives and is imported only when it runs, so
``weightprep build`` never imports torch and ``weightprep --help`` stays instant.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Any

import click

__all__ = ["main", "run"]

#: subcommand name -> (module, attribute holding the click command, one-line help)
_COMMANDS = {
    "build": ("weightprep.commands.build", "build", "Tokenize, weight, pack and write JSONL as Arrow shards."),
    "inspect": ("weightprep.commands.inspect", "inspect", "Show a shard directory's manifest and one row."),
    "train": ("weightprep.train.command", "train", "Train a causal LM on shards with the weighted loss."),
    "plan": ("weightprep.plan.command", "plan", "Estimate GPU memory per device before training."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        module, attr, _ = _COMMANDS[cmd_name]
        return getattr(importlib.import_module(module), attr)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        from weightprep.commands._output import redacting_streams

        # no URL secret in anything the command line prints, parsing errors included (weightprep.redact)
        with redacting_streams():
            try:
                return super().main(*args, **kwargs)
            except Exception:  # a bug: its traceback, printed here while the streams are still redacted
                traceback.print_exc()
                sys.exit(1)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, short) for name, (_, _, short) in _COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="weightprep")
def main() -> None:
    """weightprep: token-weighted data for causal LM fine-tuning."""


def run() -> None:
    """The ``weightprep`` command (the console script, ``python -m weightprep``): ``main``, then, where the command
    asked for it, the process ends without the interpreter's teardown (``commands._ending``)."""
    try:
        main()
    except SystemExit as exc:
        from weightprep.commands import _ending

        _ending.end(exc.code)  # returns where the process is to end as usual
        raise


if __name__ == "__main__":
    run()
